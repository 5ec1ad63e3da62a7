"""The methods a vLLM worker gains so that posttrain can put weights straight into it (vLLM's worker extension:
`--worker-extension-cls posttrain.sampling.vllm_receiver.WeightReceiver`), called through `/collective_rpc` on a
server, or `collective_rpc` on an engine in a Ray actor.

    posttrain_join(args)          join a weight group (sampling/weight_transfer.py) as rank r of world w
    posttrain_receive(args)       receive the group's bucketed broadcast and load it in place (reload_weights)
    posttrain_load_shared(args)   load the trainer's shared-memory block in place (an engine on the trainer's host)
    posttrain_leave(args)         drop a group

vLLM's HTTP /collective_rpc passes string arguments only, so each method takes one JSON string. Loading goes through
the model runner's `reload_weights` with an iterator of (name, tensor): vLLM stacks q/k/v and gate/up and repacks
for its kernels itself, the CPU build included (its linear layers hold repacked weights, which the model's plain
`load_weights` cannot write). The received tensors are in the engine's dtype already: the trainer cast them once.

This module is imported inside vLLM's worker process: it imports nothing of posttrain's beyond the transfer module.
"""

from __future__ import annotations

import json
import time
from typing import Any

from posttrain.sampling import weight_transfer as wt


class WeightReceiver:
    """Mixed into vLLM's worker class; `self` is the worker (model_runner, device)."""

    model_runner: Any  # the worker's own (declared for the type checker only: no value here)

    def _posttrain_groups(self) -> dict[str, Any]:
        groups = getattr(self, "_pt_groups", None)
        if groups is None:
            groups = self._pt_groups = {}
        return groups

    def _posttrain_device(self) -> str:
        dev = getattr(self, "device", None)
        return str(dev) if dev is not None and str(dev) != "cpu" else "cpu"

    def posttrain_join(self, args: str) -> str:
        """{"host", "port", "name", "rank", "world", "backend", "timeout_s"}: blocks until every rank joined. Older
        groups are dropped (the trainer rebuilds the group when its members change)."""
        a = json.loads(args)
        groups = self._posttrain_groups()
        groups.clear()
        t0 = time.perf_counter()
        store = wt.open_store(a["host"], int(a["port"]), int(a["world"]), int(a["rank"]), float(a["timeout_s"]))
        groups[a["name"]] = (
            store,
            wt.open_group(a["backend"], store, a["name"], int(a["rank"]), int(a["world"]), float(a["timeout_s"])),
        )
        return json.dumps({"joined": a["name"], "seconds": time.perf_counter() - t0})

    def posttrain_receive(self, args: str) -> str:
        """{"name", "specs", "buckets"}: load the broadcast in place; returns the tensors loaded."""
        specs, buckets, extra = wt.parse_layout(args)
        entry = self._posttrain_groups().get(extra["name"])
        if entry is None:
            raise RuntimeError(f"no weight group {extra['name']!r} joined in this worker")
        t0 = time.perf_counter()
        stream = wt.iter_received(entry[1], specs, buckets, self._posttrain_device())
        self.model_runner.reload_weights(weights_iterator=stream)
        return json.dumps({"tensors": len(specs), "seconds": time.perf_counter() - t0})

    def posttrain_load_shared(self, args: str) -> str:
        """{"shm", "specs"}: load the trainer's shared block in place."""
        specs, _, extra = wt.parse_layout(args)
        t0 = time.perf_counter()
        dev = self._posttrain_device()
        with wt.shared_views(extra["shm"], specs) as items:
            stream = iter(items) if dev == "cpu" else ((n, t.to(dev, non_blocking=True)) for n, t in items)
            self.model_runner.reload_weights(weights_iterator=stream)
        return json.dumps({"tensors": len(specs), "seconds": time.perf_counter() - t0})

    def posttrain_leave(self, args: str = "{}") -> str:
        self._posttrain_groups().clear()
        return "{}"
