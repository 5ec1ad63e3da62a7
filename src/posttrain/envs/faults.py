"""A test-only fault injector (`debug.rollout_fault_rate`): makes a seeded share of rollouts raise.

Failure isolation (envs/isolate.py) is the net under every env; this is how a test, or an operator checking a
deployment, sees the net hold on a real run: `posttrain train cfg.yaml debug.rollout_fault_rate=0.1` must finish
every step with about 10% of samples failed and counted (`rollout/failed_rollout`), never abort.

Which rollouts fail is a pure function of the run seed and the sample index (the n-th rollout this env was asked
for), through a hash: no global `random` state is read or advanced, so injecting faults does not change any other
draw of the run. In the sync loop the same config fails the same samples; in the async loop the index follows
the order the workers start rollouts in, so the share holds but which samples fail may differ between runs. The
index restarts at 0 on resume.
"""

from __future__ import annotations

import hashlib
from typing import Any

from posttrain.envs.task import Task
from posttrain.rewards.rubric import Score
from posttrain.sampling.base import Sampler
from posttrain.types import SampleParams, Trajectory


class InjectedFault(RuntimeError):
    """Raised by FaultyEnv on purpose: never a bug in the env."""


def fault_draw(seed: int, index: int) -> float:
    """A uniform number in [0, 1) from (seed, index) alone."""
    h = hashlib.blake2b(f"rollout-fault:{seed}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") / 2.0**64


class FaultyEnv:
    """Wraps an env: a rollout whose draw is below `rate` runs normally, then raises InjectedFault (after the
    sampling, like a parser that chokes on what the model wrote). Everything else is the wrapped env's."""

    def __init__(self, env: Any, rate: float, seed: int):
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"rollout fault rate must be in [0, 1], got {rate}")
        self.env, self.rate, self.seed = env, rate, seed
        self.index = 0  # the next rollout's sample index
        self.injected = 0

    async def rollout(self, row: dict[str, Any], sampler: Sampler, params: SampleParams | None = None) -> Trajectory:
        i, self.index = self.index, self.index + 1  # taken before any await: the order rollouts were started in
        traj = await self.env.rollout(row, sampler, params)
        if fault_draw(self.seed, i) < self.rate:
            self.injected += 1
            raise InjectedFault(f"injected fault in rollout {i} (debug.rollout_fault_rate={self.rate:g})")
        return traj

    async def score(self, trajectories: list[Trajectory]) -> list[Score]:
        return await self.env.score(trajectories)

    @property
    def task(self) -> Task:
        """The wrapped env's task (a TaskEnv: score_groups reads its group rewards and feedback)."""
        return self.env.task

    def __getattr__(self, name: str) -> Any:
        if name == "env":  # not set yet (a copy being built): no recursion through ourselves
            raise AttributeError(name)
        return getattr(self.env, name)
