import pytest

from shipping.catalog import lookup


def test_lookup_any_case():
    assert lookup("mug")["grams"] == 350
    assert lookup(" Lamp ")["cents"] == 4500


def test_unknown_sku():
    with pytest.raises(KeyError):
        lookup("SOFA")
