"""Weight sync across processes: the trainer's weights into a sampler that lives in another process.

Transports (each is a `WeightSync`: `push(version) -> metrics`, timed, with a timeout and a bounded retry):

- `SharedMemoryWeights`: same host. One pre-allocated shared-memory block (sampling/shm_blocks.py: its space
  reserved, removed even when its owner is killed) holds one copy of the synced tensors and a header with their
  version and digest; the sampler process binds its parameters to views of that block (`SharedWeightsReceiver`),
  so a push is one copy (trainer -> block) and the sampler reads the new weights in place. A cross-process lock
  keeps a push from landing in the middle of a decode, so no completion mixes two versions; the sampler checks
  each new version's digest once, and refuses a block whose last push stopped midway.
- `BroadcastWeights`: torch.distributed (gloo on CPU, NCCL on GPU). The synced tensors are flattened into one
  buffer and broadcast from the trainer rank; `BroadcastReceiver.pull()` on the sampler rank unflattens them in.
- `FileWeights`: a safetensors file written atomically plus a version file; `read_file_weights` is the reader.
- `ServerWeights`: FileWeights, then POST /update_weights_from_disk to an inference server that reloads from
  that folder (`posttrain serve --weights-dir DIR`), with a timeout and a bounded retry.

Only trainable tensors are synced (`trainable_state`): with LoRA that is the adapter alone, which is what makes
adapter-only sync cheap. bench/weight_sync.py measures each transport on the default model.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from posttrain.sampling import shm_blocks

_ALIGN = 64


class WeightSyncError(RuntimeError):
    """A push or pull did not complete within its timeout and retries."""


def trainable_state(model: Any) -> dict[str, torch.Tensor]:
    """The tensors a sync moves: the trainable ones (the LoRA adapter alone under LoRA), detached, no copy."""
    return {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str  # e.g. "float32"
    offset: int  # bytes from the start of the data area
    nbytes: int


def tensor_specs(named: dict[str, torch.Tensor]) -> list[TensorSpec]:
    """A flat layout for `named`, each tensor 64-byte aligned. Pure: both processes compute the same layout."""
    specs, off = [], 0
    for name, t in named.items():
        nbytes = t.numel() * t.element_size()
        specs.append(TensorSpec(name, tuple(t.shape), str(t.dtype).removeprefix("torch."), off, nbytes))
        off += (nbytes + _ALIGN - 1) // _ALIGN * _ALIGN
    return specs


def _with_retry(fn, timeout_s: float, retries: int, what: str):
    """Call fn(timeout_s) up to 1 + retries times; it returns True on success."""
    for _ in range(1 + retries):
        if fn(timeout_s):
            return
    raise WeightSyncError(f"{what} did not complete in {1 + retries} tries of {timeout_s:g}s")


# ---- shared memory -----------------------------------------------------------------------------------------
class SharedWeightBlock:
    """A shared-memory block (shm_blocks.Block): its header (version, digest), then each tensor at its spec's offset.
    `lock` is a multiprocessing lock shared by writer and readers; `name` None creates the block (the owner)."""

    def __init__(self, specs: list[TensorSpec], lock: Any, name: str | None = None):
        self.specs, self.lock = specs, lock
        self.nbytes = max((s.offset + s.nbytes for s in specs), default=0)
        self.owner = name is None
        self.shm: shm_blocks.Block | None = shm_blocks.create(self.nbytes) if name is None else shm_blocks.attach(name)
        self.name = self.shm.name
        self._checked = -1  # the last version whose digest this side checked

    @property
    def version(self) -> int:
        return self._block().header().version

    def _block(self) -> shm_blocks.Block:
        if self.shm is None:  # close() released it
            raise RuntimeError("the shared weight block is closed")
        return self.shm

    def writing(self, version: int) -> AbstractContextManager[None]:
        """Around a push's copy (under the lock): the block is `version`, with its digest, once the copy ends."""
        return self._block().writing(version, self.nbytes)

    def check(self) -> int:
        """The version held (under the lock): refused if the last push stopped midway, its digest checked once."""
        block = self._block()
        head = block.header()
        if head.seq % 2:
            raise WeightSyncError(f"the last weight push into {self.name} stopped midway: the block mixes versions")
        if head.version >= 0 and head.version != self._checked:
            why = shm_blocks.changed_since(block, head)
            if why:
                raise WeightSyncError(f"shared weight block {self.name} version {head.version}: {why}")
            self._checked = head.version
        return head.version

    def views(self) -> dict[str, torch.Tensor]:
        """Tensors backed by the block (no copy): writes through them are seen by every process."""
        buf = self._block().buf
        out = {}
        for s in self.specs:
            dtype = getattr(torch, s.dtype)
            n = s.nbytes // torch.empty((), dtype=dtype).element_size()
            at = shm_blocks.HEADER_BYTES + s.offset
            out[s.name] = torch.frombuffer(buf, dtype=dtype, count=n, offset=at).view(s.shape)
        return out

    def close(self) -> None:
        if self.shm is None:
            return
        self.shm.close()  # views still alive in this process: the OS frees the mapping at exit
        if self.owner:
            self.shm.unlink()
        self.shm = None


class SharedMemoryWeights:
    """Trainer side: copy the trainable tensors into the shared block under the lock, then set the version."""

    def __init__(self, model: Any, lock: Any, timeout_s: float = 30.0, retries: int = 2):
        self.model, self.timeout_s, self.retries = model, timeout_s, retries
        self.block = SharedWeightBlock(tensor_specs(trainable_state(model)), lock)
        self._views = self.block.views()

    def receiver_args(self) -> tuple[str, list[dict[str, Any]]]:
        """What a sampler process needs to attach: the block's name and the layout (picklable)."""
        return self.block.name, [asdict(s) for s in self.block.specs]

    def push(self, version: int) -> dict[str, float]:
        t0 = time.perf_counter()
        state = trainable_state(self.model)

        def attempt(timeout_s: float) -> bool:
            if not self.block.lock.acquire(timeout=timeout_s):
                return False
            try:
                with torch.no_grad(), self.block.writing(version):
                    for name, view in self._views.items():
                        view.copy_(state[name])
            finally:
                self.block.lock.release()
            return True

        _with_retry(attempt, self.timeout_s, self.retries, "shared-memory weight push (sampler held the lock)")
        return {"time/weight_sync": time.perf_counter() - t0}

    def close(self) -> None:
        self._views = {}
        self.block.close()


class SharedWeightsReceiver:
    """Sampler side: bind the model's parameters to the shared block, then decode inside `guard()`."""

    def __init__(self, name: str, specs: list[dict[str, Any]], lock: Any):
        self.block = SharedWeightBlock([TensorSpec(**{**s, "shape": tuple(s["shape"])}) for s in specs], lock, name)

    def bind(self, model: Any) -> None:
        """Make the model's synced parameters views of the block: no copy on this side, ever."""
        params = dict(model.named_parameters())
        missing = [n for n in self.block.specs if n.name not in params]
        if missing:
            raise KeyError(f"sampler model has no parameters {[s.name for s in missing[:3]]}")
        views = self.block.views()
        with torch.no_grad():
            for s in self.block.specs:
                if self.block.version < 0:  # nothing pushed yet: start from this model's own weights
                    views[s.name].copy_(params[s.name])
                params[s.name].data = views[s.name]

    @contextmanager
    def guard(self, timeout_s: float = 60.0):
        """Hold the weights still (no push lands) while decoding; yields the version being served."""
        if not self.block.lock.acquire(timeout=timeout_s):
            raise WeightSyncError(f"sampler could not take the weight lock in {timeout_s:g}s")
        try:
            yield self.block.check()
        finally:
            self.block.lock.release()

    def close(self) -> None:
        self.block.close()


# ---- torch.distributed broadcast --------------------------------------------------------------------------
class BroadcastWeights:
    """Trainer rank: broadcast the version, then one flat buffer of the trainable tensors, from `src`."""

    def __init__(self, model: Any, src: int = 0, group: Any = None):
        self.model, self.src, self.group = model, src, group

    def push(self, version: int) -> dict[str, float]:
        import torch.distributed as dist
        from torch._utils import _flatten_dense_tensors

        t0 = time.perf_counter()
        flat = _flatten_dense_tensors(list(trainable_state(self.model).values()))
        dist.broadcast(torch.tensor([version], dtype=torch.int64), self.src, group=self.group)
        dist.broadcast(flat, self.src, group=self.group)
        return {"time/weight_sync": time.perf_counter() - t0}


class BroadcastReceiver:
    """Sampler rank: receive a version and the flat buffer, copy it into the model's synced parameters.
    The process group's own timeout (init_process_group(timeout=...)) bounds the wait."""

    def __init__(self, model: Any, src: int = 0, group: Any = None):
        self.model, self.src, self.group = model, src, group
        self.targets = trainable_state(model)

    def pull(self) -> int:
        import torch.distributed as dist
        from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

        v = torch.zeros(1, dtype=torch.int64)
        dist.broadcast(v, self.src, group=self.group)
        flat = torch.empty_like(_flatten_dense_tensors(list(self.targets.values())))
        dist.broadcast(flat, self.src, group=self.group)
        with torch.no_grad():
            for t, new in zip(self.targets.values(), _unflatten_dense_tensors(flat, list(self.targets.values()))):
                t.copy_(new)
        return int(v[0])


# ---- files (external inference servers) -------------------------------------------------------------------
class FileWeights:
    """Write the trainable tensors to DIR/weights.safetensors (temp file, then rename) and DIR/version.json."""

    def __init__(self, model: Any, directory: str | Path):
        self.model, self.dir = model, Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)

    def push(self, version: int) -> dict[str, float]:
        t0 = time.perf_counter()
        save_safetensors_atomic(
            {n: t.contiguous() for n, t in trainable_state(self.model).items()}, self.dir / "weights.safetensors"
        )
        (self.dir / "version.json").write_text(json.dumps({"version": version}))
        return {"time/weight_sync": time.perf_counter() - t0}


def save_safetensors_atomic(tensors: dict[str, Any], path: str | Path, metadata: dict[str, str] | None = None) -> None:
    """`tensors` written to `path` as safetensors through a temp file beside it and a rename, so a reader never sees
    a half-written file (a server reloading, a crash mid-write)."""
    from safetensors.torch import save_file

    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=".partial")
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata=metadata)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def read_file_weights(directory: str | Path, model: Any) -> int:
    """Load what FileWeights wrote into `model`; returns the version."""
    from safetensors.torch import load_file

    d = Path(directory)
    state = load_file(str(d / "weights.safetensors"))
    params = dict(model.named_parameters())
    with torch.no_grad():
        for n, t in state.items():
            params[n].copy_(t)
    return json.loads((d / "version.json").read_text())["version"]


class ServerWeights:
    """Push to an OpenAI-compatible inference server: write the file, then ask the server to reload it."""

    def __init__(
        self,
        model: Any,
        directory: str | Path,
        url: str,
        timeout_s: float = 60.0,
        retries: int = 2,
        api_key: str | None = None,
    ):
        self.files, self.url = FileWeights(model, directory), url.rstrip("/")
        self.timeout_s, self.retries = timeout_s, retries
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def push(self, version: int) -> dict[str, float]:
        import httpx

        t0 = time.perf_counter()
        m = self.files.push(version)
        served: dict[str, int] = {}

        def attempt(timeout_s: float) -> bool:
            try:
                r = httpx.post(f"{self.url}/update_weights_from_disk", json={}, timeout=timeout_s, headers=self.headers)
            except httpx.HTTPError:
                return False
            if r.status_code != 200:
                return False
            served["v"] = r.json().get("policy_version", -1)
            return served["v"] == version

        _with_retry(attempt, self.timeout_s, self.retries, f"weight reload at {self.url}")
        return {"time/weight_sync": time.perf_counter() - t0, "time/weight_file": m["time/weight_sync"]}
