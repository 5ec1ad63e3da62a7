import pytest

from ledger.money import format_cents, to_cents


def test_to_cents():
    assert to_cents("12.5") == 1250
    assert to_cents("0.07") == 7
    assert to_cents("-3") == -300
    assert to_cents(" 4.25 ") == 425


def test_to_cents_rejects():
    for bad in ["1.234", "abc", "", "."]:
        with pytest.raises(ValueError):
            to_cents(bad)


def test_format_cents():
    assert format_cents(1250) == "12.50"
    assert format_cents(-7) == "-0.07"
    assert format_cents(123456) == "1,234.56"
