"""ObjectStoreWeights: the `WeightSync` (loop/weight_sync.py) for Ray sampler actors.

Each push puts the trainer's trainable state into the Ray object store once (`ray.put`) and has every live actor
load that one object as the new version (RaySamplerPool.load_weights: bounded waits, a dead or hung actor replaced
and loaded as it starts). The pool keeps the reference, so an actor replaced later loads the same version; the
previous version's object is freed when its reference is dropped.

What moves is `trainable_state` (sampling/weight_ipc.py): under LoRA only the adapter tensors, the frozen base being
identical in every actor (each loads the same model from the same config); without LoRA, every weight.
"""

from __future__ import annotations

import time
from typing import Any

from posttrain.cluster.ray_sampler import RaySamplerPool
from posttrain.sampling.weight_ipc import trainable_state


class ObjectStoreWeights:
    def __init__(self, model: Any, pool: RaySamplerPool, full_hf: bool = False):
        """`model`: the trainer's; `pool`: the sampler actors that must serve it; `full_hf`: the actors run vLLM
        engines, which take every weight under its HF name (a LoRA model merged; sampling/vllm_weights.py)."""
        self.model, self.pool, self.full_hf = model, pool, full_hf

    def push(self, version: int) -> dict[str, float]:
        t0 = time.perf_counter()
        if self.full_hf:
            from posttrain.sampling.vllm_weights import hf_state

            named = hf_state(self.model)
        else:
            named = trainable_state(self.model)
        state = {n: t.to("cpu", copy=True) for n, t in named.items()}
        ref = self.pool.ray.put(state)  # once per version, whatever the number of actors
        t_put = time.perf_counter() - t0
        self.pool.load_weights(ref, version)
        return {"time/weight_sync": time.perf_counter() - t0, "time/weight_sync_put": t_put,
                "cluster/weight_mb": sum(t.numel() * t.element_size() for t in state.values()) / 1e6,
                **self.pool.metrics()}

    def close(self) -> None:
        """The actors live as long as the transport that feeds them: the run's end stops them (and Ray, when the
        run started it)."""
        self.pool.close()
