"""Held-out evaluation: `samples` completions per held-out prompt (one greedy by default), scored by the task rubric.

With samples > 1 (at a temperature > 0) `eval/pass_rate` is the sampled pass@1 averaged over samples and prompts,
which is a far less noisy measure on a small held-out set than one greedy completion per prompt;
`eval/pass_at_n` is the share of prompts with at least one passing sample. A sample whose rollout or scoring
raises is a failed sample (envs/isolate.py), counted in `eval/rollout/failed_*`; it never stops the eval.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from posttrain.envs.base import TaskEnv, safe_rollout, score_groups
from posttrain.obs.metered import drain
from posttrain.obs.rollout_stats import pass_rates, rollout_metrics
from posttrain.rewards.telemetry import drain_task_metrics
from posttrain.sampling.base import Sampler
from posttrain.types import SampleParams, Trajectory


async def evaluate_async(
    env: TaskEnv,
    sampler: Sampler,
    rows: list[dict[str, Any]],
    params: SampleParams,
    samples: int = 1,
    progress: Callable[[str], None] | None = None,
    every_s: float = 60.0,
) -> tuple[dict[str, float], list[Trajectory]]:
    """`progress`: called every `every_s` seconds while rollouts are still running (a multi-turn eval can take
    many minutes, and a silent one looks hung)."""
    if samples < 1:
        raise ValueError(f"samples per held-out prompt must be >= 1, got {samples}")
    t0 = time.perf_counter()
    todo = [safe_rollout(env, r, sampler, params) for r in rows for _ in range(samples)]
    trajs = list(await _with_progress(todo, progress, every_s, t0))
    await score_groups(env, [trajs[i : i + samples] for i in range(0, len(trajs), samples)])
    rubric = env.task.rubric
    m = rollout_metrics(trajs, prefix="eval/")
    m.update(pass_rates(trajs, {c.name: c.pass_threshold for c in rubric.components}, prefix="eval/"))
    if samples > 1:
        m["eval/pass_at_n"] = pass_at_n([t.passed for t in trajs], samples)
        m["eval/samples_per_prompt"] = float(samples)
    m.update({f"eval/{k}": v for k, v in drain_task_metrics(env.task).items()})  # the eval's judge calls
    # the eval's prefix-cache counters stay out of the next step's
    m.update({f"eval/{k}": v for k, v in drain(sampler).items()})
    m["eval/seconds"] = time.perf_counter() - t0
    return m, trajs


async def _with_progress(
    coros: list[Any], progress: Callable[[str], None] | None, every_s: float, t0: float
) -> list[Trajectory]:
    """gather(coros), reporting how many have finished every `every_s` seconds until they all have."""
    if progress is None:
        return await asyncio.gather(*coros)
    done = 0

    async def counted(c: Any) -> Trajectory:
        nonlocal done
        out = await c
        done += 1
        return out

    task = asyncio.ensure_future(asyncio.gather(*(counted(c) for c in coros)))
    try:
        while True:
            finished, _ = await asyncio.wait({task}, timeout=every_s)
            if finished:
                return task.result()
            progress(f"eval: {done}/{len(coros)} rollouts done [{time.perf_counter() - t0:.0f}s]")
    finally:
        task.cancel()  # a no-op once it finished; else (we were cancelled) the rollouts stop with us


def pass_at_n(passed: list[bool], n: int) -> float:
    """Share of prompts (consecutive runs of n samples) with at least one pass."""
    groups = [passed[i : i + n] for i in range(0, len(passed), n)]
    return sum(any(g) for g in groups) / max(len(groups), 1)


def evaluate(
    env: TaskEnv,
    sampler: Sampler,
    rows: list[dict[str, Any]],
    params: SampleParams,
    samples: int = 1,
    progress: Callable[[str], None] | None = None,
) -> tuple[dict[str, float], list[Trajectory]]:
    return asyncio.run(evaluate_async(env, sampler, rows, params, samples, progress=progress))
