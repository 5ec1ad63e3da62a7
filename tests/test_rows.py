"""rows.py: the one held-out split (its edges: 0, 1, 2, 10, 1000 rows; seeded; capped), the one column reader and
the one `datasets.Dataset` check every loader shares."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from posttrain.rows import HELD_OUT_CAP, columns, held_out_count, hold_out, is_hf_dataset


@pytest.mark.parametrize(("n", "held"), [(0, 0), (1, 0), (2, 1), (10, 1), (19, 1), (20, 2), (1000, HELD_OUT_CAP)])
def test_the_default_share_is_10_percent_rounded_down_at_least_one_at_most_the_cap(n, held):
    train, evals = hold_out(list(range(n)), seed=0)
    assert len(evals) == held and sorted(train + evals) == list(range(n))


def test_fewer_than_two_rows_have_no_eval_set_and_the_rows_train():
    assert hold_out([], seed=3) == ([], [])
    assert hold_out(["only"], 0.5, seed=3) == (["only"], [])
    assert hold_out(["only"], seed=3, count=5) == (["only"], [])


def test_an_explicit_share_or_count_is_not_capped_but_one_row_always_trains():
    assert held_out_count(1000, 0.5) == 500
    assert held_out_count(10, 0.15) == 2  # rounded, as task.eval_fraction always was
    assert held_out_count(10, 0.01) == 1
    assert held_out_count(10, count=200) == 9
    assert held_out_count(10, count=0) == 0


def test_the_split_is_seeded():
    rows = list(range(1000))
    assert hold_out(rows, seed=5) == hold_out(rows, seed=5)
    assert hold_out(rows, seed=5) != hold_out(rows, seed=6)


@pytest.mark.parametrize("bad", [{"fraction": 0.0}, {"fraction": 1.0}, {"fraction": -0.1}, {"count": -1}])
def test_a_share_outside_0_1_or_a_negative_count_is_refused(bad):
    with pytest.raises(ValueError):
        held_out_count(10, **bad)


@given(n=st.integers(0, 3000), seed=st.integers(0, 2**32), fraction=st.none() | st.floats(0.001, 0.999))
def test_any_split_is_a_partition_with_one_training_row_at_least(n, seed, fraction):
    train, evals = hold_out(list(range(n)), fraction, seed)
    assert sorted(train + evals) == list(range(n))
    assert (not evals) if n < 2 else (1 <= len(evals) <= n - 1 and len(train) >= 1)
    if fraction is None:
        assert len(evals) <= HELD_OUT_CAP


def test_columns_are_every_key_in_first_seen_order():
    assert columns([{"b": 1, "a": 2}, {"c": 3, "a": 4}, {}]) == ["b", "a", "c"]
    assert columns([]) == []


def test_a_dataset_is_told_by_its_class_not_by_its_attributes():
    datasets = pytest.importorskip("datasets")

    class LooksLikeOne:  # what the old hasattr probes took for a Dataset
        column_names = ["x"]

        def to_list(self):
            return []

    assert is_hf_dataset(datasets.Dataset.from_list([{"x": 1}]))
    assert not is_hf_dataset(LooksLikeOne())
    assert not is_hf_dataset([{"x": 1}]) and not is_hf_dataset(datasets.DatasetDict())
