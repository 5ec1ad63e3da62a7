"""Metrics that reward functions keep themselves (an LLM judge's cache hits, latency, failures, position flips),
collected into a step's metrics.

Any reward object with `drain_metrics() -> dict[str, float]` (returns its counters and resets them) takes part: the
rubric's component functions (or, for a bound method, its instance), the task's group rewards and the judges a task
offers (`Task.judges`). Values of the same key from several objects are summed (counters are additive); ratio metrics
are then recomputed from their summed parts (rewards/judges/stats.py RATIOS).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from posttrain.rewards.judges.stats import with_ratios
from posttrain.rewards.rubric import Rubric

log = logging.getLogger(__name__)


class RewardOwner(Protocol):
    """What a task holds that scores (envs/task.py Task; this layer does not know tasks): its rubric, its group
    rewards and the judges it offers."""

    @property
    def rubric(self) -> Rubric: ...

    @property
    def group_rewards(self) -> list[Callable[..., Any]]: ...

    @property
    def judges(self) -> dict[str, Any]: ...


def metric_sources(task: RewardOwner | None) -> list[Any]:
    """The distinct objects of a task that have `drain_metrics`, each once; none without a task. (Reward functions
    are any callables: whether one keeps counters is asked of it here, as obs/metered.py `drain` does.)"""
    if task is None:
        return []
    cands = [c.func for c in task.rubric.components] + list(task.group_rewards) + list(task.judges.values())
    out: list[Any] = []
    for obj in cands:
        # A bound method (`ledger.score`) stands for its instance: the object that keeps the counters.
        obj = obj if callable(getattr(obj, "drain_metrics", None)) else getattr(obj, "__self__", obj)
        if callable(getattr(obj, "drain_metrics", None)) and not any(obj is o for o in out):  # the same object once
            out.append(obj)
    return out


def drain_task_metrics(task: RewardOwner | None) -> dict[str, float]:
    """Drain and merge the metrics of every source of `task` (empty when it has none). A source that raises is
    skipped with a warning: metrics never stop a step."""
    merged: dict[str, float] = {}
    for obj in metric_sources(task):
        try:
            m = obj.drain_metrics()
        except Exception as e:  # noqa: BLE001 - telemetry must not break training
            log.warning("drain_metrics of %r raised %s: %s", obj, type(e).__name__, e)
            continue
        for k, v in m.items():
            merged[k] = merged.get(k, 0.0) + float(v)
    return with_ratios(merged)
