"""Held-out evaluation: one completion per held-out prompt (greedy by default), scored by the task rubric."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from posttrain.envs.single_turn import SingleTurnEnv
from posttrain.obs.rollout_stats import pass_rates, rollout_metrics
from posttrain.sampling.base import Sampler
from posttrain.types import SampleParams, Trajectory


async def evaluate_async(env: SingleTurnEnv, sampler: Sampler, rows: list[dict[str, Any]],
                         params: SampleParams) -> tuple[dict[str, float], list[Trajectory]]:
    t0 = time.perf_counter()
    trajs = list(await asyncio.gather(*(env.rollout(r, sampler, params) for r in rows)))
    await env.score(trajs)
    rubric = env.task.rubric
    m = rollout_metrics(trajs, prefix="eval/")
    m.update(pass_rates(trajs, {c.name: c.pass_threshold for c in rubric.components}, prefix="eval/"))
    m["eval/seconds"] = time.perf_counter() - t0
    return m, trajs


def evaluate(env: SingleTurnEnv, sampler: Sampler, rows: list[dict[str, Any]],
             params: SampleParams) -> tuple[dict[str, float], list[Trajectory]]:
    return asyncio.run(evaluate_async(env, sampler, rows, params))
