import pytest

from inventory.store import Inventory, OutOfStock


def test_add_and_quantity():
    inv = Inventory()
    inv.add("apple", 3, 0.5)
    inv.add("apple", 2, 0.6)
    assert inv.quantity("apple") == 5
    assert inv.quantity("pear") == 0
    with pytest.raises(ValueError):
        inv.add("apple", 0, 1.0)


def test_remove():
    inv = Inventory()
    inv.add("apple", 3, 0.5)
    inv.remove("apple", 1)
    assert inv.quantity("apple") == 2
    inv.remove("apple", 2)
    assert "apple" not in inv.items
    with pytest.raises(OutOfStock):
        inv.remove("apple", 1)


def test_total_value():
    inv = Inventory()
    inv.add("apple", 4, 0.5)
    inv.add("pear", 1, 2.0)
    assert inv.total_value() == 4.0
