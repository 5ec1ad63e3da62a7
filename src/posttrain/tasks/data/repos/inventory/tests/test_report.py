from inventory.report import format_line, low_stock, report
from inventory.store import Inventory


def test_format_line():
    assert format_line("apple", 3, 0.5) == "apple x3 @ 0.50 = 1.50"


def test_report():
    inv = Inventory()
    inv.add("pear", 1, 2.0)
    inv.add("apple", 3, 0.5)
    assert report(inv) == "apple x3 @ 0.50 = 1.50\npear x1 @ 2.00 = 2.00\nTOTAL 3.50"


def test_low_stock():
    inv = Inventory()
    inv.add("pear", 1, 2.0)
    inv.add("apple", 3, 0.5)
    inv.add("fig", 2, 1.0)
    assert low_stock(inv, 3) == ["fig", "pear"]
