from ledger.accounts import Ledger
from ledger.report import statement, totals


def test_statement():
    ledger = Ledger()
    cash = ledger.open("cash")
    cash.post("salary", "1200.5")
    cash.post("refund", "0.07")
    cash.post("rent", "-1300")
    assert statement(cash) == "salary: 1,200.50\nrefund: 0.07\nrent: -1,300.00\nbalance: -99.43"


def test_totals_after_transfer():
    ledger = Ledger()
    ledger.open("cash").post("start", "50")
    ledger.open("savings")
    ledger.transfer("cash", "savings", "12.5")
    assert totals(ledger) == {"cash": 3750, "savings": 1250}
