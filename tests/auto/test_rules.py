"""The noise-aware keep/revert rule (auto/rules.py), case by case."""

import pytest

from posttrain.auto.rules import judge, spread


def test_within_noise_is_not_accepted():
    # incumbent 0.50 / 0.60 on two seeds: spread 0.10; a candidate 0.08 better on both seeds is within noise
    v = judge([0.63, 0.63], [0.5, 0.6], "max")
    assert v.action == "reject" and "within noise" in v.reason and v.noise == pytest.approx(0.1)


def test_one_seed_win_asks_for_a_second_seed_then_accepts():
    v = judge([0.8], [0.5, 0.6], "max")
    assert v.action == "confirm"
    assert judge([0.8, 0.75], [0.5, 0.6], "max").action == "accept"


def test_a_second_seed_can_undo_a_lucky_first():
    assert judge([0.9], [0.5, 0.6], "max").action == "confirm"
    v = judge([0.9, 0.4], [0.5, 0.6], "max")  # mean 0.65: only 0.10 better, the spread is 0.10
    assert v.action == "reject"


def test_worse_and_equal_are_rejected():
    assert "worse" in judge([0.3], [0.5, 0.6], "max").reason
    assert judge([0.55], [0.55, 0.55], "max").action == "reject"  # no spread, no improvement


def test_noise_floor_and_direction_min():
    # no spread measured (both seeds equal) but a floor of 0.05: a 0.04 gain is noise
    assert judge([0.44, 0.44], [0.4, 0.4], "max", noise_floor=0.05).action == "reject"
    assert judge([0.5, 0.5], [0.4, 0.4], "max", noise_floor=0.05).action == "accept"
    # minimising a loss: lower is better
    assert judge([1.0, 1.1], [2.0, 2.2], "min").action == "accept"
    assert judge([2.5], [2.0, 2.2], "min").action == "reject"


def test_spread_and_bad_input():
    assert spread([0.2]) == 0 and spread([0.1, 0.4, 0.3]) == pytest.approx(0.3)
    with pytest.raises(ValueError):
        judge([], [0.5], "max")
