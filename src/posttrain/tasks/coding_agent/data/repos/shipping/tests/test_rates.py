import pytest

from shipping.rates import rate


def test_bands_are_inclusive():
    assert rate(0.2, 1) == 500
    assert rate(1.0, 1) == 500
    assert rate(1.01, 1) == 900
    assert rate(20.0, 1) == 1500


def test_zones_and_limits():
    assert rate(3, 2) == 1350
    with pytest.raises(ValueError):
        rate(1, 9)
    with pytest.raises(ValueError):
        rate(25, 1)
