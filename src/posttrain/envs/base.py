"""The Env protocol: an episode turns one task row into a Trajectory by calling a Sampler.

    async def rollout(row, sampler) -> Trajectory      one episode (single- or multi-turn)
    async def score(trajectories) -> None              set rewards; batched so reward models can batch too

Envs never touch the trainer. A GRPO group is G concurrent rollouts of the same row; samplers coalesce
concurrent calls into one batch, so an env can stay written one episode at a time.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from posttrain.sampling.base import Sampler
from posttrain.types import Trajectory


@runtime_checkable
class Env(Protocol):
    async def rollout(self, row: dict[str, Any], sampler: Sampler) -> Trajectory: ...

    async def score(self, trajectories: list[Trajectory]) -> None: ...
