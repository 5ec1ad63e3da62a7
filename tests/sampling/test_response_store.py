"""The bounded store behind previous_response_id (sampling/response_store.py)."""

from collections import OrderedDict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.sampling.response_store import ResponseStore


def test_least_recently_used_goes_first():
    store = ResponseStore(max_responses=2, max_chars=100)
    store.put("a", [{"role": "user", "content": "a"}], 1)
    store.put("b", [], 1)
    assert store.get("a") is not None  # a is now the most recently used
    store.put("c", [], 1)
    assert store.get("b") is None and store.get("a") is not None and store.get("c") is not None


def test_characters_bound_the_store_and_a_huge_entry_is_not_kept():
    store = ResponseStore(max_responses=100, max_chars=10)
    store.put("a", [], 6)
    store.put("b", [], 6)  # 12 > 10: a goes
    assert store.get("a") is None and store.get("b") == [] and store.chars == 6
    store.put("huge", [], 11)
    assert store.get("huge") is None and store.get("b") == []


def test_get_returns_a_copy():
    store = ResponseStore()
    store.put("a", [{"role": "user", "content": "x"}], 1)
    store.get("a").append({"role": "user", "content": "y"})  # type: ignore[union-attr]
    assert len(store.get("a")) == 1  # type: ignore[arg-type]


def test_no_room_is_refused():
    with pytest.raises(ValueError):
        ResponseStore(max_responses=0)


ops = st.lists(
    st.tuples(st.sampled_from(["put", "get"]), st.sampled_from("abcdefgh"), st.integers(0, 40)), max_size=80
)


@settings(max_examples=200, deadline=None)
@given(ops=ops, max_responses=st.integers(1, 5), max_chars=st.integers(1, 60))
def test_matches_a_plain_lru_model(ops, max_responses, max_chars):
    store = ResponseStore(max_responses=max_responses, max_chars=max_chars)
    model: OrderedDict[str, int] = OrderedDict()
    for op, key, chars in ops:
        if op == "put":
            model.pop(key, None)
            if chars <= max_chars:
                model[key] = chars
            while len(model) > max_responses or sum(model.values()) > max_chars:
                model.popitem(last=False)
            store.put(key, [{"role": "user", "content": key}], chars)
        else:
            got = store.get(key)
            assert (got is not None) == (key in model)
            if key in model:
                model.move_to_end(key)
                assert got == [{"role": "user", "content": key}]
        assert len(store) == len(model) <= max_responses
        assert store.chars == sum(model.values()) <= max_chars
