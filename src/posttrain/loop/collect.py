"""Collectors: where a step's scored groups come from.

    Collector.collect(step) -> Collected     the step's groups, rolled out, scored and shaped
    Collector.on_weights(version)            the sampler now serves `version` (admits waiting work, async)
    Collector.window_metrics(wall_s)         utilisation since the last call (async: busy/idle fractions)
    Collector.adjust(overrides)              sample the next groups with a remedy's overrides (obs/remedies.py)
    Collector.close()                        stop background work

`SyncCollector` samples the step's prompts when asked (with DAPO dynamic sampling when configured);
`AsyncCollector` (loop/async_collect.py) keeps rollout workers running ahead under the staleness bound. Both
roll out and score groups with `RolloutSpec.groups`, so a group means the same thing in either schedule. Each
sample is rolled out and scored in isolation (envs/isolate.py): an env that raises on one output fails that
sample, counted in the step's `rollout/failed_*` metrics, and the step goes on.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from posttrain.algos.dapo import has_signal
from posttrain.envs.base import TaskEnv, safe_rollout, score_groups
from posttrain.guidance.guided_hint import first_prompt_ids, strip_prompt
from posttrain.loop.batch import number_samples
from posttrain.loop.dynamic_sampling import collect_groups, refill_rows
from posttrain.loop.row_choice import RowChooser, UniformRows
from posttrain.loop.shaping import apply_overlong_penalty
from posttrain.loop.step_plan import CollectPlan
from posttrain.obs.remedies import Overrides
from posttrain.obs.timers import StageTimer
from posttrain.sampling.base import Sampler
from posttrain.types import Group, SampleParams, Trajectory


@dataclass
class Collected:
    groups: list[Group]  # the groups to train on
    all_groups: list[Group]  # every group sampled this step (dynamic sampling drops some), for the metrics
    metrics: dict[str, float] = field(default_factory=dict)

    def numbered(self) -> Collected:
        """These groups with each trajectory's sample_id, its position over `all_groups` (loop/batch.py
        `number_samples`): `groups` are some of `all_groups`, numbered alike."""
        numbered = number_samples(self.all_groups)
        new = {id(g): n for g, n in zip(self.all_groups, numbered, strict=True)}
        return replace(self, groups=[new[id(g)] for g in self.groups], all_groups=numbered)


class Collector(Protocol):
    @property
    def sampler(self) -> Sampler: ...  # the rollout sampler: its counters go into each step's record

    async def collect(self, step: int, timer: StageTimer) -> Collected: ...

    async def on_weights(self, version: int) -> None: ...

    def adjust(self, overrides: Overrides) -> None: ...

    def window_metrics(self, wall_s: float) -> dict[str, float]: ...

    async def close(self) -> None: ...


@dataclass(frozen=True)
class RolloutSpec:
    """How a step's groups are rolled out: the env, the sampler, G, how to sample, the overlong shaping and a
    remedy's row transform. `groups(rows)` rolls out, scores and shapes them."""

    env: TaskEnv
    sampler: Sampler
    rows: list[dict[str, Any]]
    G: int
    params: SampleParams
    overlong_buffer_frac: float = 0.0
    overlong_penalty: float = 1.0
    row_transform: Callable[[dict[str, Any]], dict[str, Any]] | None = None  # e.g. a remedy's format hint
    # Train the transformed rows' samples as if sampled from the untransformed prompt (a remedy's guide mode);
    # only a share of each group is transformed, the rest sampled from the plain row.
    untransform: bool = False
    transform_share: float = 1.0
    # Transformed rows by index: the same object every step, since envs cache rendered prompts per row.
    _transformed: dict[int, dict[str, Any]] = field(default_factory=dict, init=False, compare=False, repr=False)
    _plain_ids: dict[int, list[int] | None] = field(default_factory=dict, init=False, compare=False, repr=False)

    async def groups(self, row_indices: list[int], timer: StageTimer) -> tuple[list[Group], float]:
        """G rollouts per row, scored (group rewards included) and shaped. Returns the groups and the mean
        overlong penalty."""
        G = self.G
        # Per row, the first n_t of its G samples use the transformed row (all of them unless guided).
        n_t = G if not self.untransform else min(G, max(1, math.ceil(G * self.transform_share)))
        rows = [self._row(i) if j < n_t else self.rows[i] for i in row_indices for j in range(G)]
        guided = self.untransform and self.row_transform is not None
        with timer("sample"):
            trajs = list(await asyncio.gather(*(safe_rollout(self.env, r, self.sampler, self.params) for r in rows)))
            rolled = [trajs[i * G : (i + 1) * G] for i in range(len(row_indices))]
            if guided:
                rolled = [await self._stripped(idx, g, n_t) for idx, g in zip(row_indices, rolled, strict=True)]
        with timer("reward"):
            scored = await score_groups(self.env, rolled)
        if guided:
            scored = [_with_remedy_hint(self.rows[idx], g) for idx, g in zip(row_indices, scored, strict=True)]
        groups = [Group(task_index=idx, trajectories_G=g) for idx, g in zip(row_indices, scored, strict=True)]
        return apply_overlong_penalty(groups, self.overlong_buffer_frac, self.overlong_penalty, self.params.max_tokens)

    async def _stripped(self, idx: int, group: list[Trajectory], n_t: int) -> list[Trajectory]:
        """Row idx's group with its first n_t samples (those drawn from the hinted row) as if from the plain row."""
        plain = await self._plain_prompt_ids(idx)
        # a sample whose rollout failed has no sampled turn to re-prompt
        return [
            strip_prompt(t, self.rows[idx], plain) if j < n_t and t.failed_in != "rollout" else t
            for j, t in enumerate(group)
        ]

    def _row(self, i: int) -> dict[str, Any]:
        if self.row_transform is None:
            return self.rows[i]
        if i not in self._transformed:
            self._transformed[i] = self.row_transform(self.rows[i])
        return self._transformed[i]

    async def _plain_prompt_ids(self, i: int) -> list[int] | None:
        """The first prompt the env renders for row i untransformed (cached; None if the env does not say)."""
        if i not in self._plain_ids:
            self._plain_ids[i] = await first_prompt_ids(self.env, self.rows[i], self.params)
        return self._plain_ids[i]

    def adjusted(self, ov: Overrides) -> RolloutSpec:
        """These rollouts under a remedy's overrides (temperature, G, extra stop strings, the soft overlong
        penalty, a format hint); neutral overrides give back the configured rollouts."""
        from posttrain.obs.remedies import with_format_hint

        params = replace(
            self.params,
            temperature=ov.temperature or self.params.temperature,
            stop=list(self.params.stop) + [x for x in ov.extra_stop if x not in self.params.stop],
        )
        return replace(
            self,
            G=ov.num_generations or self.G,
            params=params,
            overlong_buffer_frac=(
                self.overlong_buffer_frac if ov.overlong_buffer_frac is None else ov.overlong_buffer_frac
            ),
            row_transform=with_format_hint if ov.format_hint else None,
            untransform=ov.format_hint and ov.guide,
            transform_share=ov.guide_share,
        )


def _with_remedy_hint(row: dict[str, Any], group: list[Trajectory]) -> list[Trajectory]:
    """The format hint is also words for a self-distillation teacher (remedies.format_hint_distill): the policy that
    reads it becomes the teacher of every stalled sample of the group that did not pass."""
    hint = row.get("format_hint")
    if not hint:
        return group
    return [
        replace(t, guidance=replace(t.guidance, remedy_hint=str(hint))) if not t.passed and not t.failed else t
        for t in group
    ]


class SyncCollector:
    """Sample the step's prompts now; with dynamic sampling, refill until enough groups carry signal."""

    def __init__(self, plan: CollectPlan, rollouts: RolloutSpec, rows: RowChooser | None = None):
        """`plan`: what each step collects (loop/step_plan.py); `rows`: which rows each step draws
        (loop/row_choice.py; default: uniform)."""
        self.plan, self.rollouts, self.configured = plan, rollouts, rollouts
        self.rows: RowChooser = rows if rows is not None else UniformRows(plan.seed)

    @property
    def sampler(self) -> Sampler:
        """The rollout sampler: the stepper drains its counters (prefix cache, vLLM) into each step's record."""
        return self.rollouts.sampler

    def adjust(self, overrides: Overrides) -> None:
        self.rollouts = self.configured.adjusted(overrides)

    async def collect(self, step: int, timer: StageTimer) -> Collected:
        plan = self.plan
        n_rows = len(self.rollouts.rows)
        k = plan.prompts_per_step
        first = self.rows.rows_for(step, k, self.rollouts.rows)
        penalties: list[float] = []

        async def sample(rows: list[int]) -> list[Group]:
            groups, pen = await self.rollouts.groups(rows, timer)
            penalties.append(pen)
            return groups

        m: dict[str, float] = {}
        if plan.dynamic_sampling:
            kept, all_groups, stats = await collect_groups(
                sample,
                first,
                lambda rnd, k, used: refill_rows(n_rows, step, rnd, k, plan.seed, used),
                target=plan.prompts_per_step,
                max_rounds=plan.max_refill_rounds,
                keep=lambda g: has_signal(g.rewards_G),
            )
            m.update(stats.metrics())
        else:
            kept = all_groups = await sample(first)
        self.rows.observe(step, all_groups)
        if plan.overlong_penalty:
            m["dapo/overlong_penalty_mean"] = sum(penalties) / max(len(penalties), 1)
        return Collected(kept, all_groups, m)

    async def on_weights(self, version: int) -> None:
        """Nothing waits: the next collect samples with whatever the sampler serves."""

    def window_metrics(self, wall_s: float) -> dict[str, float]:
        return {}

    async def close(self) -> None:
        return None
