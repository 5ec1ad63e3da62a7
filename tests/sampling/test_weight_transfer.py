"""The flat layout and shared-memory block that carry weights straight into engines (sampling/weight_transfer.py),
without an engine: tensors in, the same tensors out. The group broadcast: tests/sampling/test_weight_group.py."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.sampling import weight_transfer as wt


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"a.weight": torch.randn(7, 5, generator=g), "b.bias": torch.randn(3, generator=g),
            "c.weight": torch.randn(64, 33, generator=g), "steps": torch.arange(5)}


@given(st.lists(st.integers(1, 5000), min_size=1, max_size=30), st.integers(1, 20000))
@settings(max_examples=60, deadline=None)
def test_buckets_cover_the_layout_on_tensor_boundaries(sizes, bucket):
    state = {f"t{i}": torch.empty(n, dtype=torch.float32) for i, n in enumerate(sizes)}
    specs = wt.engine_specs(state, "bfloat16")
    buckets = wt.plan_buckets(specs, bucket)
    assert buckets[0][0] == 0 and buckets[-1][1] == wt.total_bytes(specs)
    for (a, b), (c, _) in zip(buckets, buckets[1:]):
        assert b == c  # contiguous
    starts = {s.offset for s in specs}
    for a, b in buckets:  # a bucket starts at a tensor and ends where the next starts (or the layout ends)
        assert a in starts and (b in starts or b == wt.total_bytes(specs))  # no tensor is cut
        inside = [s for s in specs if a <= s.offset < b]
        data_end = max(s.offset + s.nbytes for s in inside)  # the alignment padding after it is not counted
        assert data_end - a <= bucket or len(inside) == 1  # over the bound only for one big tensor


def test_layout_casts_floats_only_and_round_trips_as_json():
    specs = wt.engine_specs(_state(), "bfloat16")
    assert [s.dtype for s in specs] == ["bfloat16", "bfloat16", "bfloat16", "int64"]
    assert all(s.offset % 64 == 0 for s in specs)
    back, buckets, extra = wt.parse_layout(wt.layout_json(specs, [(0, 128)], name="g1"))
    assert back == specs and buckets == [(0, 128)] and extra == {"name": "g1"}


def test_a_missing_tensor_is_named():
    flat = wt.FlatWeights(wt.engine_specs(_state(), None))
    with pytest.raises(KeyError, match="lack 1 tensors"):
        flat.fill({k: v for k, v in _state().items() if k != "b.bias"})
    flat.close()


def test_shared_block_is_read_by_name_with_the_cast_values():
    state = _state()
    specs = wt.engine_specs(state, "bfloat16")
    flat = wt.FlatWeights(specs, shared=True)
    try:
        flat.fill(state)
        with wt.shared_views(flat.name, specs) as items:
            got = {n: t.clone() for n, t in items}
        assert got.keys() == state.keys()
        for n, t in state.items():
            want = t.to(torch.bfloat16) if t.is_floating_point() else t
            assert got[n].dtype == want.dtype and torch.equal(got[n], want)
        state["a.weight"] += 1  # a new push replaces the block's contents in place
        flat.fill(state)
        with wt.shared_views(flat.name, specs) as items:
            assert torch.equal(dict(items)["a.weight"], state["a.weight"].to(torch.bfloat16))
    finally:
        flat.close()
