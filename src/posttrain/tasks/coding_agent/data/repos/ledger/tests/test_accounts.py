import pytest

from ledger.accounts import Ledger


def test_post_and_balance():
    ledger = Ledger()
    cash = ledger.open("cash")
    cash.post("salary", "100")
    cash.post("coffee", "-2.5")
    assert cash.balance() == 9750


def test_transfer():
    ledger = Ledger()
    ledger.open("cash").post("start", "50")
    ledger.open("savings")
    ledger.transfer("cash", "savings", "20")
    assert ledger.accounts["cash"].balance() == 3000
    assert ledger.accounts["savings"].balance() == 2000


def test_open_twice_and_bad_transfer():
    ledger = Ledger()
    ledger.open("cash")
    ledger.open("rent")
    with pytest.raises(ValueError):
        ledger.open("cash")
    with pytest.raises(ValueError):
        ledger.transfer("cash", "rent", "0")
