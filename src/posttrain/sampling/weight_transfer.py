"""Weights straight into engines: one flat host copy of the weights in the engine's dtype, read from shared memory by
engines on this host and broadcast over a torch.distributed group to engines anywhere.

    specs = engine_specs(state, "bfloat16")       the layout: each tensor's name, shape, dtype and byte offset
    flat = FlatWeights(specs, shared=True)        one buffer (in /dev/shm when shared) holding that layout
    flat.fill(state)                              the trainer's tensors cast into it (one copy)
    group = open_group("gloo", host, port, rank=0, world=1 + K, timeout_s=60)    trainer side; engines: rank 1..K
    send_flat(group, flat.data, buckets)          a bucketed broadcast from rank 0
    iter_received(group, specs, buckets, device)  engine side: (name, tensor) as each bucket arrives
    with shared_views(shm_name, specs) as items   engine side, same host: (name, tensor) views of the block

Why one flat copy: it is the cast (fp32 trainer -> bf16 engine) done once whatever the number of engines, it is
what same-host engines map (no serialisation, no file), it is what the group broadcasts in buckets, and it still
holds the last pushed version after the push: an engine restarted between pushes loads it again without the
trainer (whose weights may have moved on) taking part.

Why buckets: a receiver loads bucket k while bucket k+1 is on the wire (`iter_received` posts the next receive before
it yields), and a bucket bounds the memory a receiver on a GPU needs beside its weights. The layout is computed by
the trainer alone and sent as JSON with each load, so an engine needs no copy of the trainer's model.

The group is its own `ProcessGroupGloo` / `ProcessGroupNCCL` over a `TCPStore` the trainer hosts (port 0: the OS
picks a free one), never torch.distributed's default group: an engine process (vLLM's workers) has its own default
group, and the trainer under FSDP2 has the training ranks'. Every collective has the group's timeout, so a peer that
dies mid-broadcast fails the call within it instead of hanging the trainer.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from datetime import timedelta
from multiprocessing import shared_memory
from typing import Any

import torch

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
    """One uint8 buffer holding `specs`; in a named shared-memory block when `shared` (same-host engines map it)."""

    def __init__(self, specs: list[TensorSpec], shared: bool = False):
        self.specs = specs
        size = max(total_bytes(specs), 1)
        self.shm = shared_memory.SharedMemory(create=True, size=size) if shared else None
        self.data = (
            torch.frombuffer(self.shm.buf, dtype=torch.uint8, count=size)
            if self.shm is not None
            else torch.empty(size, dtype=torch.uint8)
        )
        self._views = {s.name: _typed(self.data, s) for s in specs}

    @property
    def name(self) -> str | None:
        """The shared block's name (what a same-host engine attaches to); None for a private buffer."""
        return self.shm.name if self.shm is not None else None

    @torch.no_grad()
    def fill(self, state: dict[str, torch.Tensor]) -> None:
        """Copy (and cast) every tensor of the layout from `state`; a missing name is the caller's bug."""
        missing = [n for n in self._views if n not in state]
        if missing:
            raise KeyError(f"the weights to push lack {len(missing)} tensors of the layout, e.g. {missing[:3]}")
        for name, view in self._views.items():
            view.copy_(state[name].detach())

    def close(self) -> None:
        self._views = {}
        self.data = torch.empty(0, dtype=torch.uint8)  # drops the export of the shared buffer
        if self.shm is not None:
            try:
                self.shm.close()
            except BufferError:  # a view still alive in this process: the OS frees the mapping at exit
                pass
            self.shm.unlink()
            self.shm = None


# ---- the group ------------------------------------------------------------------------------------------------
def group_backend() -> str:
    """nccl where this process has a GPU (the engines then receive on theirs), gloo otherwise."""
    return "nccl" if torch.cuda.is_available() else "gloo"


def open_store(host: str, port: int, world: int, rank: int, timeout_s: float) -> Any:
    """The group's rendezvous: rank 0 hosts it (port 0: a free port, read back from `.port`)."""
    import torch.distributed as dist

    return dist.TCPStore(  # pyright: ignore[reportPrivateImportUsage]  # public; torch re-exports it without `as`
        host, port, world, is_master=rank == 0, timeout=timedelta(seconds=timeout_s), wait_for_workers=False
    )


def open_group(backend: str, store: Any, name: str, rank: int, world: int, timeout_s: float) -> Any:
    """A process group of its own over `store` (not torch.distributed's default group). Blocks until every rank has
    joined or `timeout_s` passes. gloo on CPU, nccl on GPU: the same calls after this."""
    import torch.distributed as dist

    if backend not in ("gloo", "nccl"):
        raise ValueError(f"weight group backend must be gloo or nccl, got {backend!r}")
    prefixed = dist.PrefixStore(name, store)  # pyright: ignore[reportPrivateImportUsage]  # public, as TCPStore
    td = timedelta(seconds=timeout_s)
    if backend == "gloo":
        return dist.ProcessGroupGloo(prefixed, rank, world, td)
    opts = dist.ProcessGroupNCCL.Options()
    opts._timeout = td
    return dist.ProcessGroupNCCL(prefixed, rank, world, opts)


def send_flat(group: Any, data: torch.Tensor, buckets: list[tuple[int, int]], device: str = "cpu") -> None:
    """Rank 0: broadcast each bucket of `data` (all posted at once, then waited on, so the transport pipelines them).
    On a GPU group each bucket is copied to `device` first. Raises when a peer fails or the group's timeout passes."""
    works = []
    for a, b in buckets:
        chunk = data[a:b] if device == "cpu" else data[a:b].to(device, non_blocking=True)
        works.append((group.broadcast([chunk], _root0()), chunk))
    for w, _ in works:
        w.wait()


def _root0() -> Any:
    import torch.distributed as dist

    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    return opts


def iter_received(
    group: Any, specs: list[TensorSpec], buckets: list[tuple[int, int]], device: str = "cpu"
) -> Iterator[tuple[str, torch.Tensor]]:
    """Ranks 1..K: every tensor of the layout, bucket by bucket, as (name, tensor) for a loader to consume; the next
    bucket's receive is posted before this one's tensors are handed out, so receiving and loading overlap."""
    if not buckets:
        return
    by_bucket: list[list[TensorSpec]] = [[] for _ in buckets]
    k = 0
    for s in specs:
        while s.offset >= buckets[k][1]:
            k += 1
        by_bucket[k].append(s)

    def post(i: int) -> tuple[Any, torch.Tensor]:
        a, b = buckets[i]
        buf = torch.empty(b - a, dtype=torch.uint8, device=device)
        return group.broadcast([buf], _root0()), buf

    pending = post(0)
    for i in range(len(buckets)):
        work, buf = pending
        work.wait()
        if i + 1 < len(buckets):
            pending = post(i + 1)
        for s in by_bucket[i]:
            yield s.name, _typed(buf, s, base=buckets[i][0])


def attach_shared(name: str) -> shared_memory.SharedMemory:
    """Attach to a block another process owns. Python 3.11 registers an attached block with this process's resource
    tracker, which unlinks it when this process exits (an engine restarting would delete the trainer's block):
    unregistered here, the owner alone unlinks it."""
    shm = shared_memory.SharedMemory(name=name, create=False)
    try:
        from multiprocessing import resource_tracker

        # `_name` is the name as the tracker registered it (`name` drops the leading "/")
        registered = shm._name  # pyright: ignore[reportAttributeAccessIssue]  # private, so untyped
        resource_tracker.unregister(registered, "shared_memory")
    except Exception:  # noqa: BLE001 - a Python that does not track attached blocks has nothing to undo
        pass
    return shm


@contextmanager
def shared_views(shm_name: str, specs: list[TensorSpec]) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Same host: every tensor of the layout as (name, view of the trainer's shared block), no copy until the loader
    copies it into the engine. The views are valid inside the `with` only: the block is unmapped at its end (a view
    kept past it would read unmapped memory)."""
    shm = attach_shared(shm_name)
    try:
        data = torch.frombuffer(shm.buf, dtype=torch.uint8, count=max(total_bytes(specs), 1))
        yield [(s.name, _typed(data, s)) for s in specs]
        del data
    finally:
        try:
            shm.close()
        except BufferError:  # a view is still exported; the mapping goes with the process
            pass
