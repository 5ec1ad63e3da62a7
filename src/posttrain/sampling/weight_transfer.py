"""Weights straight into engines: one flat host copy of the weights in the engine's dtype, read from shared memory by
engines on this host and broadcast over a torch.distributed group to engines anywhere.

    specs = engine_specs(state, "bfloat16")       the layout: each tensor's name, shape, dtype and byte offset
    flat = FlatWeights(specs, shared=True)        one buffer (in /dev/shm when shared) holding that layout
    flat.fill(state)                              the trainer's tensors cast into it (one copy), a new version
    buckets = plan_buckets(specs, bucket_bytes)   the byte ranges the group broadcasts (sampling/weight_group.py)
    load_shared(shm_name, specs, load)            engine side, same host: `load` gets (name, tensor) views of the
                                                  block, again if a fill tore its copy; the version it loaded back

Why one flat copy: it is the cast (fp32 trainer -> bf16 engine) done once whatever the number of engines, it is
what same-host engines map (no serialisation, no file), it is what the group broadcasts in buckets, and it still
holds the last pushed version after the push: an engine restarted between pushes loads it again without the
trainer (whose weights may have moved on) taking part. The block's naming, space, version header and removal are
sampling/shm_blocks.py's: a copy a refill tore is never loaded as a version, and nothing outlives its owner.

Why buckets: a receiver loads bucket k while bucket k+1 is on the wire (the group posts the next receive before
it yields), and a bucket bounds the memory a receiver on a GPU needs beside its weights. The layout is computed by
the trainer alone and sent as JSON with each load, so an engine needs no copy of the trainer's model.

The group itself (its store, who may join it, the broadcast and the digest each bucket is checked against) is
sampling/weight_group.py's.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any

import torch

from posttrain.sampling import shm_blocks
from posttrain.sampling.weight_ipc import TensorSpec

_ALIGN = 64
DEFAULT_BUCKET_MB = 64.0
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def engine_specs(state: dict[str, torch.Tensor], dtype: str | None) -> list[TensorSpec]:
    """The flat layout of `state` as the engine holds it: floating tensors in `dtype` (None or "auto": as they are),
    each 64-byte aligned. Pure: computed from shapes and dtypes only."""
    cast = DTYPES.get(dtype or "")
    specs, off = [], 0
    for name, t in state.items():
        dt = cast if cast is not None and t.is_floating_point() else t.dtype
        nbytes = t.numel() * torch.empty((), dtype=dt).element_size()
        specs.append(TensorSpec(name, tuple(t.shape), str(dt).removeprefix("torch."), off, nbytes))
        off += (nbytes + _ALIGN - 1) // _ALIGN * _ALIGN
    return specs


def total_bytes(specs: list[TensorSpec]) -> int:
    return max((s.offset + s.nbytes for s in specs), default=0)


def plan_buckets(specs: list[TensorSpec], bucket_bytes: int) -> list[tuple[int, int]]:
    """Byte ranges [start, stop) of the flat buffer, cut on tensor boundaries, each at most `bucket_bytes` unless one
    tensor alone is larger (it is then a bucket of its own). Pure; sender and receivers use the same plan."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
    buckets: list[tuple[int, int]] = []
    start = None
    for s in specs:
        end = s.offset + s.nbytes
        if start is None:
            start = s.offset
        elif end - start > bucket_bytes:
            buckets.append((start, s.offset))
            start = s.offset
        last_end = end
    if start is not None:
        buckets.append((start, last_end))
    return buckets


def layout_json(specs: list[TensorSpec], buckets: list[tuple[int, int]] | None = None, **extra: Any) -> str:
    """The layout as an engine receives it (vLLM's /collective_rpc passes strings only)."""
    return json.dumps({"specs": [asdict(s) for s in specs], "buckets": buckets or [], **extra})


def parse_layout(text: str) -> tuple[list[TensorSpec], list[tuple[int, int]], dict[str, Any]]:
    d = json.loads(text)
    specs = [
        TensorSpec(s["name"], tuple(s["shape"]), s["dtype"], int(s["offset"]), int(s["nbytes"])) for s in d.pop("specs")
    ]
    buckets = [(int(a), int(b)) for a, b in d.pop("buckets")]
    return specs, buckets, d


def _typed(data: torch.Tensor, s: TensorSpec, base: int = 0) -> torch.Tensor:
    """The tensor `s` as a view of the uint8 buffer `data` whose first byte is flat offset `base`."""
    a = s.offset - base
    return data[a : a + s.nbytes].view(getattr(torch, s.dtype)).view(s.shape)


class FlatWeights:
    """One uint8 buffer holding `specs`; in a named shared-memory block when `shared` (same-host engines map it),
    after the block's header (sampling/shm_blocks.py), with all its space reserved up front."""

    def __init__(self, specs: list[TensorSpec], shared: bool = False):
        self.specs = specs
        size = max(total_bytes(specs), 1)
        self.block = shm_blocks.create(size) if shared else None
        self.data = (
            torch.frombuffer(self.block.buf, dtype=torch.uint8, count=size, offset=shm_blocks.HEADER_BYTES)
            if self.block is not None
            else torch.empty(size, dtype=torch.uint8)
        )
        self._views = {s.name: _typed(self.data, s) for s in specs}
        self.fills = 0

    @property
    def name(self) -> str | None:
        """The shared block's name (what a same-host engine attaches to); None for a private buffer."""
        return self.block.name if self.block is not None else None

    @torch.no_grad()
    def fill(self, state: dict[str, torch.Tensor], version: int | None = None) -> None:
        """Copy (and cast) every tensor of the layout from `state`; a missing name is the caller's bug. In a shared
        block the copy is `version` (by default the count of fills) once it completes, with its digest."""
        missing = [n for n in self._views if n not in state]
        if missing:
            raise KeyError(f"the weights to push lack {len(missing)} tensors of the layout, e.g. {missing[:3]}")
        self.fills += 1
        if self.block is None:
            self._copy(state)
            return
        with self.block.writing(self.fills if version is None else version, total_bytes(self.specs)):
            self._copy(state)

    def _copy(self, state: dict[str, torch.Tensor]) -> None:
        for name, view in self._views.items():
            view.copy_(state[name].detach())

    def close(self) -> None:
        self._views = {}
        self.data = torch.empty(0, dtype=torch.uint8)  # drops the export of the shared buffer
        if self.block is not None:
            self.block.close()  # a view still alive in this process: the OS frees the mapping at exit
            self.block.unlink()
            self.block = None


# ---- the group ------------------------------------------------------------------------------------------------
def group_backend() -> str:
    """nccl where this process has a GPU (the engines then receive on theirs), gloo otherwise."""
    return "nccl" if torch.cuda.is_available() else "gloo"


def _block_views(block: shm_blocks.Block, specs: list[TensorSpec]) -> list[tuple[str, torch.Tensor]]:
    size = max(total_bytes(specs), 1)
    data = torch.frombuffer(block.buf, dtype=torch.uint8, count=size, offset=shm_blocks.HEADER_BYTES)
    return [(s.name, _typed(data, s)) for s in specs]


def load_shared(
    shm_name: str,
    specs: list[TensorSpec],
    load: Callable[[list[tuple[str, torch.Tensor]]], None],
    tries: int = 3,
    timeout_s: float = 60.0,
) -> int:
    """Same host: `load` copies every tensor of the layout out of the trainer's shared block, given as (name, view)
    (no copy before the loader's own). A copy during which the trainer refilled the block is not a version: `load`
    runs again, up to `tries` times (shm_blocks.TornReadError after). Returns the version loaded. The views are
    valid inside `load` only: the block is unmapped after it (a view kept past it would read unmapped memory)."""
    block = shm_blocks.attach(shm_name)
    try:
        version, _ = shm_blocks.read_verified(
            block, lambda: load(_block_views(block, specs)), total_bytes(specs), tries, timeout_s
        )
        return version
    finally:
        block.close()


@contextmanager
def shared_views(
    shm_name: str, specs: list[TensorSpec], timeout_s: float = 60.0
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """One copy of `load_shared`, as a `with`: the (name, view) pairs inside it; at its end shm_blocks.TornReadError
    if a fill changed the block during it (what was copied is not a version). The views are valid inside the
    `with` only."""
    block = shm_blocks.attach(shm_name)
    try:
        head = shm_blocks.wait_readable(block, total_bytes(specs), timeout_s)
        yield _block_views(block, specs)
        why = shm_blocks.changed_since(block, head)
        if why:
            raise shm_blocks.TornReadError(f"shared-memory block {shm_name}: {why} during the copy")
    finally:
        block.close()
