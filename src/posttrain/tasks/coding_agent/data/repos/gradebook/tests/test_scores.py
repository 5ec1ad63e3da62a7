import pytest

from gradebook.scores import average, weighted


def test_average_drops_the_lowest():
    assert average([50, 80, 90]) == pytest.approx(220 / 3)
    assert average([50, 80, 90], drop_lowest=1) == 85
    assert average([70], drop_lowest=1) == 0.0


def test_weighted():
    parts = {"homework": [100, 40], "exams": [80]}
    assert weighted(parts, {"homework": 0.5, "exams": 0.5}) == pytest.approx(75)
    assert weighted(parts, {"homework": 0.5, "exams": 0.5}, {"homework": 1}) == pytest.approx(90)
    with pytest.raises(ValueError):
        weighted(parts, {"homework": 0.5})
