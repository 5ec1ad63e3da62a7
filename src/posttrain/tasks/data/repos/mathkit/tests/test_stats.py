import pytest

from mathkit.stats import mean, median, mode, variance


def test_mean():
    assert mean([1, 2, 3]) == 2
    with pytest.raises(ValueError):
        mean([])


def test_median():
    assert median([3, 1, 2]) == 2
    assert median([4, 1, 3, 2]) == 2.5
    with pytest.raises(ValueError):
        median([])


def test_mode():
    assert mode([1, 2, 2, 3]) == 2
    assert mode([3, 1, 3, 1]) == 1


def test_variance():
    assert variance([2, 4, 4, 4, 5, 5, 7, 9]) == 4
    assert variance([5]) == 0
