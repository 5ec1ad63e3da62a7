"""The asynchronous collector (`loop.mode=async`): rollout workers run while the trainer trains.

    workers (asyncio tasks) ─► generate + env + reward per group ─► ready buffer ─► collect(step)
                 ▲                                                                    │
                 └──── on_weights(version): the sampler serves newer weights ◄───────┘ (after the stepper's sync)

Producer-consumer as in the Tunix seed post. The sampler holds its own copy of the model (the stepper's
WeightSync copies the trainer's weights in), so generation goes on while the trainer updates its weights; every
completion records the version that produced it.

One staleness knob, `loop.max_staleness`, enforced at admission (loop/staleness.py): a worker does not start a
group until the sampler is recent enough, so no work is generated and then discarded. With `loop.interruptible`
(the default) a sync lands between two decode steps of a generation in flight (sampling/weight_gate.py), so the
trainer never waits for a long generation to end; tokens after the sync carry the newer version, so a sequence's
oldest token (its first) is what the bound is about, and every token is checked against it. `collect(step)` returns
the groups of step s in the data order (the same prompts as the sync collector) and checks the bound. Which
log-probs the PPO ratio uses is not this module's business: `algorithm.behavior_logprobs` decides it, the same
in both schedules.

Resuming restarts the workers at the checkpoint's weights: in-flight rollouts are not saved, so a resumed async
run is not bit-identical to an uninterrupted one.

A worker never dies of one sample: `RolloutSpec.groups` rolls out and scores each sample in isolation
(envs/isolate.py), so an env that raises on one output gives that sample back failed and the group goes on. What
still stops a worker (and, through `_failure`, the run) is what is not a sample's doing: a lost env worker or
sampler pool, or a bug in the loop itself.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from posttrain.loop.collect import Collected, RolloutSpec
from posttrain.loop.row_choice import RowChooser, UniformRows
from posttrain.loop.staleness import admissible, staleness_metrics, token_staleness_metrics
from posttrain.loop.step_plan import CollectPlan
from posttrain.obs import trace
from posttrain.obs.metered import drain
from posttrain.obs.timers import BusyMeter, StageTimer
from posttrain.sampling.context import ContextBudget
from posttrain.types import Completion, Group, SampleParams


class MeteredSampler:
    """Delegates to a sampler and records when generation is in flight (for the sampler-idle fraction)."""

    def __init__(self, inner, meter: BusyMeter):
        self.inner, self.meter = inner, meter

    @property
    def policy_version(self) -> int:
        return self.inner.policy_version

    @property
    def context(self) -> ContextBudget | None:
        return self.inner.context

    async def sample(self, prompts_P: list[list[int]], params: SampleParams, n: int = 1) -> list[list[Completion]]:
        with self.meter():
            return await self.inner.sample(prompts_P, params, n)

    def decode(self, token_ids: list[int]) -> str:
        return self.inner.decode(token_ids)

    def drain_metrics(self) -> dict[str, float]:
        """The wrapped sampler's counters (prefix reuse, in-flight pushes), drained into the step's metrics."""
        return drain(self.inner)


class AsyncCollector:
    def __init__(
        self, plan: CollectPlan, rollouts: RolloutSpec, meters: dict[str, BusyMeter], rows: RowChooser | None = None
    ):
        """`plan`: steps, staleness bound, workers, batch timeout (loop/step_plan.py); `rollouts.sampler` is the
        (metered) rollout sampler; `meters` has model_call, rollout and reward; `rows` which rows each step draws
        (loop/row_choice.py; default: uniform)."""
        self.plan, self.rollouts, self.meters = plan, rollouts, meters
        self.configured = rollouts
        self.per_step = plan.prompts_per_step
        self.k = plan.max_staleness
        self.n_workers = plan.rollout_workers or self.per_step * (self.k + 1)
        self._ready: dict[int, tuple[Group, float]] = {}
        self._cond = asyncio.Condition()
        self._workers: list[asyncio.Task] = []
        self._next_group = 0
        self._failure: BaseException | None = None
        self._wait_s = 0.0
        self._busy_mark = {k: m.read() for k, m in meters.items()}
        # A step's rows are chosen when its first group starts; an adaptive chooser decides from its record as it
        # stands then (workers run up to max_staleness steps ahead of what the record has seen).
        self.rows: RowChooser = rows if rows is not None else UniformRows(plan.seed)
        self._chosen: dict[int, list[int]] = {}

    @property
    def version(self) -> int:
        return self.rollouts.sampler.policy_version

    @property
    def sampler(self) -> Any:
        """The rollout sampler (the stepper drains its metrics as the sync collector's)."""
        return self.rollouts.sampler

    # ---- producers ---------------------------------------------------------------------------------------
    def _start(self, step: int) -> None:
        self._next_group = step * self.per_step
        self._workers = [asyncio.create_task(self._worker(f"rollout-{k}")) for k in range(self.n_workers)]

    async def _worker(self, name: str) -> None:
        try:
            while True:
                i = self._next_group
                s = i // self.per_step
                if s >= self.plan.steps:
                    return
                self._next_group += 1
                async with self._cond:
                    with trace.span("wait_weights", worker=name, group=i):  # admission: the staleness bound
                        await self._cond.wait_for(lambda i=i: admissible(i, self.per_step, self.version, self.k))
                row = self._rows(s)[i % self.per_step]
                with self.meters["rollout"]():
                    (group,), pen = await self.rollouts.groups([row], StageTimer(worker=name))
                async with self._cond:
                    self._ready[i] = (group, pen)
                    self._cond.notify_all()
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # noqa: BLE001 - surface a worker crash in the trainer, don't hang it
            self._failure = e
            async with self._cond:
                self._cond.notify_all()

    def _rows(self, s: int) -> list[int]:
        if s not in self._chosen:
            self._chosen[s] = self.rows.rows_for(s, self.per_step, self.rollouts.rows)
        return self._chosen[s]

    def adjust(self, overrides) -> None:
        """Groups started from now on use the overrides (groups in flight finish as they began)."""
        self.rollouts = self.configured.adjusted(overrides)

    async def on_weights(self, version: int) -> None:
        """Wake the workers waiting for admission: the sampler serves a newer version."""
        async with self._cond:
            self._cond.notify_all()

    async def close(self) -> None:
        for w in self._workers:
            w.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        self._workers = []

    # ---- consumer ----------------------------------------------------------------------------------------
    async def collect(self, step: int, timer: StageTimer) -> Collected:
        if not self._workers:
            self._start(step)
        want = range(step * self.per_step, (step + 1) * self.per_step)
        t0 = time.perf_counter()
        try:
            async with self._cond:
                with trace.span("wait_rollouts", worker="trainer", step=step + 1):  # the trainer idles here
                    await asyncio.wait_for(
                        self._cond.wait_for(lambda: self._failure is not None or all(i in self._ready for i in want)),
                        self.plan.batch_timeout_s,
                    )
        except TimeoutError:
            missing = [i for i in want if i not in self._ready]
            raise TimeoutError(
                f"step {step}: groups {missing} not ready after loop.batch_timeout_s="
                f"{self.plan.batch_timeout_s:g}s (a rollout, env or reward is hanging)"
            ) from None
        if self._failure is not None:
            raise RuntimeError(f"a rollout worker failed: {self._failure!r}") from self._failure
        self._wait_s = time.perf_counter() - t0
        ready = [self._ready.pop(i) for i in want]
        groups = [g for g, _ in ready]
        self._chosen.pop(step, None)
        self.rows.observe(step, groups)
        version = self.version  # == the trainer's weights: the last sync copied them
        trajs = [t for g in groups for t in g.trajectories_G]
        too_old = sorted({v for t in trajs for v in t.token_versions() if version - v > self.k})
        if too_old:  # admission makes this impossible; a violation is a bug, not a statistic
            raise RuntimeError(
                f"staleness bound broken: trainer at version {version}, tokens from {too_old[:3]}, "
                f"max_staleness={self.k}"
            )
        m = {
            "async/ready_groups": float(len(self._ready)),
            "async/trainer_wait_s": self._wait_s,
            **staleness_metrics(version, [t.policy_version for t in trajs]),
            **token_staleness_metrics(version, trajs),
        }
        if self.plan.overlong_penalty:
            m["dapo/overlong_penalty_mean"] = sum(p for _, p in ready) / max(len(ready), 1)
        return Collected(groups, groups, m)

    def window_metrics(self, wall_s: float) -> dict[str, float]:
        """Busy seconds of model calls and rollouts since the last call, and the idle fractions over `wall_s`."""
        now = {k: m.read() for k, m in self.meters.items()}
        busy = {k: now[k] - self._busy_mark.get(k, 0.0) for k in now}
        self._busy_mark = now
        wall = max(wall_s, 1e-9)
        return {
            "async/step_wall_s": wall,
            "async/trainer_idle_frac": min(1.0, self._wait_s / wall),
            "async/sampler_idle_frac": max(0.0, 1.0 - busy["model_call"] / wall),
            "time/model_call_busy": busy["model_call"],
            "time/rollout_busy": busy["rollout"],
        }
