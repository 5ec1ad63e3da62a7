from shipping.order import Order


def test_same_product_is_one_line():
    order = Order()
    order.add("mug")
    order.add("MUG", 2)
    assert order.lines == {"MUG": 3}


def test_weight_and_shipping():
    order = Order(zone=2)
    order.add("lamp")
    assert order.weight_kg() == 1.8
    assert order.shipping() == 1350
    assert order.total() == 4500 + 1350


def test_five_tees_weigh_one_kilo():
    order = Order()
    order.add("tee", 5)
    assert order.weight_kg() == 1.0
    assert order.total() == 4500 + 500


def test_small_order_pays_shipping():
    order = Order()
    order.add("book", 2)
    assert order.total() == 1800 + 500


def test_free_shipping_from_fifty():
    order = Order(zone=3)
    order.add("lamp")
    order.add("book")
    assert order.subtotal() == 5400 and order.shipping() == 0
