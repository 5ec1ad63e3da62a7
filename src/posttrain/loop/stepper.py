"""What a Run drives: the `Stepper` protocol, and `StepResult`, everything one step reports.

A step hands back what happened as a value: its metrics, the trajectories it rolled out (scored, for samples.jsonl
and the console), and what the update measured of the shown ones. The Run logs, shows and watches that value and
reads nothing else from the stepper; a remedy's overrides go back in through `apply_overrides`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from posttrain.obs.remedies import Overrides
from posttrain.types import SampleStats, Trajectory


@dataclass(frozen=True)
class StepResult:
    """One step's report. `metrics`: the train record's values. `trajectories`: every rollout of the step, failed
    ones included (in group order). `stats`: what the update measured of the shown rows (their log-probs before the
    update and advantages), by sample_id; empty where the stepper runs no backward pass (ES)."""

    metrics: dict[str, Any]
    trajectories: list[Trajectory] = field(default_factory=list)
    stats: dict[int, SampleStats] = field(default_factory=dict)


class Stepper(Protocol):
    """One training step at a time. `step(i)` trains step i (0-based) and returns its `StepResult`;
    `apply_overrides` takes a remedy's overrides for the next steps (loop/watch.py); `state_dict()` /
    `load_state_dict()` hold everything a checkpoint needs beyond the RNG states; `close()` stops background work."""

    async def step(self, step: int) -> StepResult: ...

    def apply_overrides(self, ov: Overrides) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    async def close(self) -> None: ...
