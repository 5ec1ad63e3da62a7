"""Calibration math (rewards/calibration.py): ECE, Brier, RLCR, reliability bins."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.rewards.calibration import bin_index, brier, ece, ece_from_bins, reliability_bins, rlcr_reward


def test_ece_of_a_perfectly_calibrated_set_is_about_zero() -> None:
    rng = random.Random(0)
    conf = [rng.random() for _ in range(20000)]
    correct = [1.0 if rng.random() < c else 0.0 for c in conf]  # right exactly as often as it says
    assert ece(conf, correct) < 0.02


def test_ece_of_an_overconfident_set_is_large() -> None:
    rng = random.Random(1)
    conf = [0.95] * 1000
    correct = [1.0 if rng.random() < 0.5 else 0.0 for _ in conf]  # says 95%, right half the time
    assert ece(conf, correct) > 0.4


def test_ece_exact_small_case() -> None:
    # bin 9: conf 0.9 and 1.0, one right -> |0.5 - 0.95| = 0.45; bin 2: conf 0.2, wrong -> 0.2. Weighted: (2*.45 + .2)/3
    assert ece([0.9, 1.0, 0.2], [1, 0, 0]) == pytest.approx((2 * 0.45 + 0.2) / 3)
    assert ece([], []) == 0.0


def test_brier_bounds_and_cases() -> None:
    assert brier({"a": 1.0}, "a") == 0.0
    assert brier({"b": 1.0}, "a") == 2.0  # sure and wrong: the maximum
    assert brier({"a": 0.5, "b": 0.5}, "a") == pytest.approx(0.5)
    assert brier({"a": 0.6, "b": 0.4}, {"a": 0.6, "b": 0.4}) == 0.0  # a gold distribution, matched


def test_rlcr_is_maximised_at_the_true_chance() -> None:
    p = 0.7  # chance of being right
    expected = lambda q: p * rlcr_reward(q, 1.0) + (1 - p) * rlcr_reward(q, 0.0)  # noqa: E731
    best = max((i / 100 for i in range(101)), key=expected)
    assert best == pytest.approx(p)
    assert rlcr_reward(1.0, 1.0) == 1.0 and rlcr_reward(1.0, 0.0) == -1.0


def test_reliability_bins() -> None:
    bins = reliability_bins([0.05, 0.15, 0.95, 1.0], [0, 1, 1, 1], n_bins=10)
    assert [b.count for b in bins] == [1, 1, 0, 0, 0, 0, 0, 0, 0, 2]
    assert bins[9].conf_mean == pytest.approx(0.975) and bins[9].accuracy == 1.0
    assert math.isnan(bins[4].accuracy)
    assert bin_index(1.0, 10) == 9 and bin_index(0.0, 10) == 0 and bin_index(1.5, 10) == 9
    with pytest.raises(ValueError, match="correctness"):
        reliability_bins([0.5], [])


unit = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(unit, unit), max_size=60), st.integers(min_value=1, max_value=20))
def test_ece_in_unit_interval(pairs, n_bins) -> None:
    conf, correct = [p[0] for p in pairs], [p[1] for p in pairs]
    e = ece(conf, correct, n_bins)
    assert 0.0 <= e <= 1.0 + 1e-12
    assert e == pytest.approx(ece_from_bins(reliability_bins(conf, correct, n_bins)))


@st.composite
def distributions(draw, labels=("a", "b", "c", "d")):
    w = draw(st.lists(st.floats(min_value=0.0, max_value=1.0, allow_nan=False), min_size=len(labels), max_size=len(labels)))
    total = sum(w) or 1.0
    return {k: x / total for k, x in zip(labels, w)} if sum(w) else {labels[0]: 1.0}


@settings(max_examples=100, deadline=None)
@given(distributions(), st.one_of(st.sampled_from(["a", "b", "c", "d"]), distributions()))
def test_brier_in_0_2(probs, target) -> None:
    assert 0.0 <= brier(probs, target) <= 2.0 + 1e-9
