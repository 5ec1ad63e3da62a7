"""`Metered`: an object that keeps counters between steps (a sampler's prefix cache, vLLM's, a judge, a worker
pool) and hands them over once: `drain_metrics()` returns what it counted since the last call and resets.

Each step drains the rollout sampler into its training record and each eval drains the eval sampler into the
eval record, so a counter lands in exactly one record. `drain(obj)` is the one place that asks whether an object
keeps counters at all.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class Metered(Protocol):
    def drain_metrics(self) -> dict[str, float]:
        """The counters since the last call (then reset)."""
        ...


def drain(obj: object) -> dict[str, float]:
    """`obj`'s counters since the last drain, or {} for an object that keeps none."""
    return obj.drain_metrics() if isinstance(obj, Metered) else {}
