"""WeightSync: how the sampler comes to serve the trainer's weights.

    WeightSync.push(version) -> metrics    blocking (the stepper runs it in a thread); afterwards the sampler
                                           serves the trainer's current weights as `version`
    WeightSync.close()                     at the run's end: release what the transport holds (Ray sampler
                                           actors: cluster/ray_weights.py); nothing for the in-process ones

Transports here:
- `SharedWeights`: the sampler holds the trainer's own module (the sync loop, one process): nothing to move,
  the version is bumped.
- `CopyWeights`: the sampler holds its own copy of the model (the async loop): the trainable tensors are copied
  in between decodes.
- `VersionedPush`: another transport (a server reload), then the sampler tags its samples with the pushed
  version (`cluster.backend=server`).
- `LowPrecisionCopy`: the sampler holds a bf16 or int8 copy (sampling.precision): each push re-quantizes the
  policy's weights into it in place (sampling/precision.py).
- `GatheredWeights`: the trainer is FSDP2-sharded over ranks (trainer.sharding=fsdp2), so the sampler cannot
  hold its module: each push gathers the full weights into rank 0's whole model (a collective every trainer rank
  runs), then the transport above it carries them on to the sampler.
Every push is timed (`time/weight_sync`). A transport that crosses a process or a network adds its own
timeout and bounded retry behind the same call.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from posttrain.sampling.base import Versioned
from posttrain.training.protocol import PolicyTrainer


class WeightSync(Protocol):
    def push(self, version: int) -> dict[str, float]: ...

    def close(self) -> None: ...


class SharedWeights:
    def __init__(self, sampler: Versioned):
        self.sampler = sampler

    def push(self, version: int) -> dict[str, float]:
        self.sampler.set_version(version)
        return {}

    def close(self) -> None:
        """The sampler lives in this process: nothing to release."""


class CopyWeights:
    def __init__(self, model: Any, sampler: Any):
        """`model`: the trainer's; `sampler`: has `load_weights(state, version)` (HFSampler does)."""
        self.model, self.sampler = model, sampler

    def push(self, version: int) -> dict[str, float]:
        t0 = time.perf_counter()
        state = {n: p.detach() for n, p in self.model.named_parameters() if p.requires_grad}
        self.sampler.load_weights(state, version)
        return {"time/weight_sync": time.perf_counter() - t0}

    def close(self) -> None:
        """The sampler lives in this process: nothing to release."""


class LowPrecisionCopy:
    def __init__(self, model: Any, sampler: Any, precision: str):
        """`sampler`: an HFSampler whose model is `low_precision_copy(model, precision)`."""
        self.model, self.sampler, self.precision = model, sampler, precision

    def push(self, version: int) -> dict[str, float]:
        from posttrain.sampling.precision import refresh_

        t0 = time.perf_counter()
        self.sampler.update_weights(lambda m: refresh_(m, self.model, self.precision), version)
        return {"time/weight_sync": time.perf_counter() - t0}

    def close(self) -> None:
        """The sampler lives in this process: nothing to release."""


class GatheredWeights:
    def __init__(self, trainer: PolicyTrainer, model: Any, then: WeightSync):
        """`trainer`: a DataParallelTrainer over ShardedTrainers (its `full_params()` is the collective gather);
        `model`: rank 0's whole copy, the one the run's sampler, eval and final/ export read; `then`: the transport
        from `model` to the rollout sampler (SharedWeights when the sampler holds `model`, a copy otherwise).

        No retry: the gather is a collective over the trainer ranks, bounded by trainer.dist_timeout_s, and one
        that fails leaves the process group broken (the run stops with TrainerRankError and resumes from its last
        checkpoint)."""
        self.trainer, self.model, self.then = trainer, model, then

    def push(self, version: int) -> dict[str, float]:
        import torch

        t0 = time.perf_counter()
        full = self.trainer.full_params()
        with torch.no_grad():
            for n, p in self.model.named_parameters():
                if n in full:
                    p.copy_(full[n])
        gathered = time.perf_counter() - t0
        m = self.then.push(version)
        return {**m, "time/weight_gather": gathered, "time/weight_sync": time.perf_counter() - t0}

    def close(self) -> None:
        self.then.close()


class VersionedPush:
    """After the transport's push, the sampler tags what it samples with the pushed version (a server that reports
    its own version in each answer overrides the tag)."""

    def __init__(self, inner: Any, sampler: Versioned):
        self.inner, self.sampler = inner, sampler

    def push(self, version: int) -> dict[str, float]:
        m = self.inner.push(version)
        self.sampler.set_version(version)
        return m

    def close(self) -> None:
        """Nothing to release: the server is the user's."""
