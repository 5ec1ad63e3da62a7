"""Held-out evaluation: `samples` completions per held-out prompt (one greedy by default), scored by the task rubric.

With samples > 1 (at a temperature > 0) `eval/pass_rate` is the sampled pass@1 averaged over samples and prompts,
which is a far less noisy measure on a small held-out set than one greedy completion per prompt;
`eval/pass_at_n` is the share of prompts with at least one passing sample. A sample whose rollout or scoring
raises is a failed sample (envs/isolate.py), counted in `eval/rollout/failed_*`; it never stops the eval.

Bounded: at most MAX_EVAL_SAMPLES (1024) samples per prompt, and at most `concurrency` rollouts alive at once, each
created when an earlier one finishes (rollouts started together still reach the sampler in one loop turn and are
batched). Building every rollout up front made `--samples 1000000` a MemoryError after 94 s at 3.4 GiB.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, cast

from posttrain.config.loop import MAX_EVAL_SAMPLES
from posttrain.envs.base import TaskEnv, safe_rollout, score_groups
from posttrain.errors import PosttrainError
from posttrain.obs.metered import drain
from posttrain.obs.rollout_stats import pass_rates, rollout_metrics
from posttrain.rewards.telemetry import drain_task_metrics
from posttrain.sampling.base import Sampler
from posttrain.types import SampleParams, Trajectory

# Rollouts alive at once: vLLM's default batch (max_num_seqs), four of the own decode loop's (max_batch 64); an eval
# of up to this many rollouts starts them all together, as before.
EVAL_CONCURRENCY = 256


class EvalSettingsError(PosttrainError, ValueError):
    """An eval asked for what it cannot bound: samples per prompt outside 1..MAX_EVAL_SAMPLES, a temperature that
    is not a finite number >= 0."""


def check_samples(samples: int) -> int:
    if not 1 <= samples <= MAX_EVAL_SAMPLES:
        raise EvalSettingsError(f"samples per prompt must be at least 1 and at most {MAX_EVAL_SAMPLES}, got {samples}")
    return samples


async def evaluate_async(
    env: TaskEnv,
    sampler: Sampler,
    rows: list[dict[str, Any]],
    params: SampleParams,
    samples: int = 1,
    progress: Callable[[str], None] | None = None,
    every_s: float = 60.0,
    concurrency: int = EVAL_CONCURRENCY,
) -> tuple[dict[str, float], list[Trajectory]]:
    """`progress`: called every `every_s` seconds while rollouts are still running (a multi-turn eval can take
    many minutes, and a silent one looks hung). `concurrency`: rollouts alive at once."""
    check_samples(samples)
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    t0 = time.perf_counter()

    def rollout(i: int) -> Awaitable[Trajectory]:  # sample i % samples of prompt i // samples
        return safe_rollout(env, rows[i // samples], sampler, params)

    rolled = await _bounded(rollout, len(rows) * samples, concurrency, progress, every_s, t0)
    scored = await score_groups(env, [rolled[i : i + samples] for i in range(0, len(rolled), samples)])
    trajs = [t for g in scored for t in g]
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


async def _bounded(
    rollout: Callable[[int], Awaitable[Trajectory]],
    total: int,
    concurrency: int,
    progress: Callable[[str], None] | None,
    every_s: float,
    t0: float,
) -> list[Trajectory]:
    """rollout(0) .. rollout(total - 1), their results in that order: `concurrency` workers each take the next index
    when their rollout finishes, so no more than that many exist at once. Reports how many have finished every
    `every_s` seconds until they all have."""
    out: list[Trajectory | None] = [None] * total
    todo = iter(range(total))  # shared: each index is taken once (workers take turns on one event loop)
    done = 0

    async def worker() -> None:
        nonlocal done
        for i in todo:
            out[i] = await rollout(i)
            done += 1

    workers = [asyncio.ensure_future(worker()) for _ in range(min(concurrency, total))]
    every = asyncio.gather(*workers)
    try:
        while True:
            finished, _ = await asyncio.wait({every}, timeout=every_s if progress else None)
            if finished:
                every.result()  # a rollout that raised past its isolation (a cancellation, a dead engine)
                break
            if progress is not None:
                progress(f"eval: {done}/{total} rollouts done [{time.perf_counter() - t0:.0f}s]")
    finally:
        for w in workers:  # no-ops once they finished; else (one failed, or we were cancelled) the rest stop with us
            w.cancel()
    return cast("list[Trajectory]", out)  # every worker ran to the end of `todo`: each slot is filled


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
    concurrency: int = EVAL_CONCURRENCY,
) -> tuple[dict[str, float], list[Trajectory]]:
    return asyncio.run(evaluate_async(env, sampler, rows, params, samples, progress, concurrency=concurrency))
