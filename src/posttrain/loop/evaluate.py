"""Held-out evaluation: `samples` completions per held-out prompt (one greedy by default), scored by the task rubric.

With samples > 1 (at a temperature > 0) `eval/pass_rate` is the sampled pass@1 averaged over samples and prompts,
which is a far less noisy measure on a small held-out set than one greedy completion per prompt;
`eval/pass_at_n` is the share of prompts with at least one passing sample.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from posttrain.envs.base import score_groups
from posttrain.envs.single_turn import SingleTurnEnv
from posttrain.obs.rollout_stats import pass_rates, rollout_metrics
from posttrain.rewards.telemetry import drain_task_metrics
from posttrain.sampling.base import Sampler
from posttrain.types import SampleParams, Trajectory


async def evaluate_async(env: SingleTurnEnv, sampler: Sampler, rows: list[dict[str, Any]],
                         params: SampleParams, samples: int = 1) -> tuple[dict[str, float], list[Trajectory]]:
    if samples < 1:
        raise ValueError(f"samples per held-out prompt must be >= 1, got {samples}")
    t0 = time.perf_counter()
    trajs = list(await asyncio.gather(*(env.rollout(r, sampler, params) for r in rows for _ in range(samples))))
    await score_groups(env, [trajs[i:i + samples] for i in range(0, len(trajs), samples)])
    rubric = env.task.rubric
    m = rollout_metrics(trajs, prefix="eval/")
    m.update(pass_rates(trajs, {c.name: c.pass_threshold for c in rubric.components}, prefix="eval/"))
    if samples > 1:
        m["eval/pass_at_n"] = pass_at_n([t.passed for t in trajs], samples)
        m["eval/samples_per_prompt"] = float(samples)
    m.update({f"eval/{k}": v for k, v in drain_task_metrics(env.task).items()})  # the eval's judge calls
    m["eval/seconds"] = time.perf_counter() - t0
    return m, trajs


def pass_at_n(passed: list[bool], n: int) -> float:
    """Share of prompts (consecutive runs of n samples) with at least one pass."""
    groups = [passed[i:i + n] for i in range(0, len(passed), n)]
    return sum(any(g) for g in groups) / max(len(groups), 1)


def evaluate(env: SingleTurnEnv, sampler: Sampler, rows: list[dict[str, Any]],
             params: SampleParams, samples: int = 1) -> tuple[dict[str, float], list[Trajectory]]:
    return asyncio.run(evaluate_async(env, sampler, rows, params, samples))
