"""The methods a vLLM worker gains so that posttrain can put weights straight into it (vLLM's worker extension:
`--worker-extension-cls posttrain.sampling.vllm_receiver.WeightReceiver`), called through `/collective_rpc` on a
server, or `collective_rpc` on an engine in a Ray actor.

    posttrain_join(args)          join a weight group (sampling/weight_group.py) by its invitation (rank, secret)
    posttrain_receive(args)       receive the group's bucketed broadcast, each bucket checked against its digest,
                                  and load it in place (reload_weights)
    posttrain_load_shared(args)   load the trainer's shared-memory block in place (an engine on the trainer's host)
    posttrain_leave(args)         drop a group

vLLM's HTTP /collective_rpc passes string arguments only, so each method takes one JSON string. Loading goes through
the model runner's `reload_weights` with an iterator of (name, tensor): vLLM stacks q/k/v and gate/up and repacks
for its kernels itself, the CPU build included (its linear layers hold repacked weights, which the model's plain
`load_weights` cannot write). The received tensors are in the engine's dtype already: the trainer cast them once.

This module is imported inside vLLM's worker process: it imports nothing of posttrain's beyond the transfer and
group modules.
"""

from __future__ import annotations

import json
import time
from typing import Any

from posttrain.sampling import weight_group as wg
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
        """An Invitation (sampling/weight_group.py) as JSON: blocks until every rank joined and presented the group's
        tag, at most about the group's timeout. Older groups are dropped (the trainer rebuilds the group when its
        members change)."""
        inv = wg.Invitation.from_json(args)
        groups = self._posttrain_groups()
        groups.clear()
        t0 = time.perf_counter()
        groups[inv.name] = wg.open_group(inv, device=self._posttrain_device())
        return json.dumps({"joined": inv.name, "seconds": time.perf_counter() - t0})

    def posttrain_receive(self, args: str) -> str:
        """{"name", "specs", "buckets", "nonce", "digests"}: load the broadcast in place, each bucket only once it
        matched its digest; returns the tensors loaded. A forged bucket fails the call (ForgedWeights) before any
        of its tensors is loaded, and the group is dropped: the trainer re-pushes in a fresh one."""
        specs, buckets, extra = wt.parse_layout(args)
        groups = self._posttrain_groups()
        group = groups.get(extra["name"])
        if group is None:
            raise RuntimeError(f"no weight group {extra['name']!r} joined in this worker")
        t0 = time.perf_counter()
        stream = wg.iter_received(group, specs, buckets, str(extra.get("nonce", "")), list(extra.get("digests", [])))
        try:
            self.model_runner.reload_weights(weights_iterator=stream)
        except BaseException:
            groups.clear()
            raise
        return json.dumps({"tensors": len(specs), "seconds": time.perf_counter() - t0})

    def posttrain_load_shared(self, args: str) -> str:
        """{"shm", "specs"}: load the trainer's shared block in place (again if a refill tore the copy)."""
        specs, _, extra = wt.parse_layout(args)
        t0 = time.perf_counter()
        dev = self._posttrain_device()

        def load(items: list[tuple[str, Any]]) -> None:
            stream = iter(items) if dev == "cpu" else ((n, t.to(dev, non_blocking=True)) for n, t in items)
            self.model_runner.reload_weights(weights_iterator=stream)

        wt.load_shared(extra["shm"], specs, load)
        return json.dumps({"tensors": len(specs), "seconds": time.perf_counter() - t0})

    def posttrain_leave(self, args: str = "{}") -> str:
        self._posttrain_groups().clear()
        return "{}"
