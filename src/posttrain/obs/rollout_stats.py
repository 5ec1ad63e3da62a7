"""Summary statistics of a set of scored trajectories (rewards, pass rates, lengths, failures).

Failures: `rollouts/failed` counts every failed sample (a reward function that raised, an env's own failure, an
isolated exception); `rollout/failed_rollout` and `rollout/failed_score` count the samples whose `env.rollout` or
`env.score` raised and were isolated (envs/isolate.py), and `rollout/failed_frac` is the failed share of all.
Those three are in a record only when one of its samples failed (absent: 0), so runs without failures keep the
records they had (tests/loop/test_reference_runs.py compares them key for key).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

from posttrain.types import TASK_COLUMN, SampleStats, Trajectory


def rollout_metrics(trajs: list[Trajectory], prefix: str = "") -> dict[str, float]:
    if not trajs:
        return {}
    ok = [t for t in trajs if not t.failed]
    rewards = [t.reward for t in ok] or [0.0]
    lens = [t.num_completion_tokens for t in trajs]
    m: dict[str, float] = {
        f"{prefix}reward/mean": statistics.fmean(rewards),
        f"{prefix}reward/std": statistics.pstdev(rewards) if len(rewards) > 1 else 0.0,
        f"{prefix}pass_rate": sum(t.passed for t in trajs) / len(trajs),
        f"{prefix}completion/len_mean": statistics.fmean(lens),
        f"{prefix}completion/len_max": float(max(lens)),
        f"{prefix}completion/truncated_frac": sum(t.turns[-1].finish_reason == "length" for t in trajs) / len(trajs),
        f"{prefix}rollouts/failed": float(len(trajs) - len(ok)),
        f"{prefix}rollouts/count": float(len(trajs)),
        **failure_metrics(trajs, prefix),
    }
    guided = [t for t in trajs if t.guided]
    if guided:  # a remedy's hinted samples: the pass rate of the plain ones says whether the policy learned it
        plain = [t for t in trajs if not t.guided]
        m[f"{prefix}pass_rate/guided"] = sum(t.passed for t in guided) / len(guided)
        if plain:
            m[f"{prefix}pass_rate/unguided"] = sum(t.passed for t in plain) / len(plain)
    m.update(per_task_metrics(trajs, prefix))
    for key in sorted({k for t in trajs for k in t.metrics}):
        m[f"{prefix}episode/{key}"] = statistics.fmean(t.metrics.get(key, 0.0) for t in trajs)
    names = list(ok[0].reward_components if ok else {})
    for name in names:
        vals = [t.reward_components.get(name, 0.0) for t in ok]
        m[f"{prefix}reward/{name}"] = statistics.fmean(vals)
    return m


def per_task_metrics(trajs: list[Trajectory], prefix: str = "") -> dict[str, float]:
    """A mixture's samples by task (their rows' TASK_COLUMN): `task/<name>/pass_rate`, `reward`, `samples`."""
    by: dict[str, list[Trajectory]] = {}
    for t in trajs:
        name = t.row.get(TASK_COLUMN)
        if name is not None:
            by.setdefault(str(name), []).append(t)
    m: dict[str, float] = {}
    for name, ts in sorted(by.items()):
        ok = [t.reward for t in ts if not t.failed]
        m[f"{prefix}task/{name}/pass_rate"] = sum(t.passed for t in ts) / len(ts)
        m[f"{prefix}task/{name}/reward"] = statistics.fmean(ok) if ok else 0.0
        m[f"{prefix}task/{name}/samples"] = float(len(ts))
    return m


def failure_metrics(trajs: list[Trajectory], prefix: str = "") -> dict[str, float]:
    """Isolated failures by where they happened, and the failed share of all samples (every cause); {} when
    none failed."""
    where = [t.failed_in for t in trajs if t.failed]
    if not where:
        return {}
    return {
        f"{prefix}rollout/failed_rollout": float(where.count("rollout")),
        f"{prefix}rollout/failed_score": float(where.count("score")),
        f"{prefix}rollout/failed_frac": len(where) / len(trajs) if trajs else 0.0,
    }


def pass_rates(trajs: list[Trajectory], thresholds: dict[str, float], prefix: str = "") -> dict[str, float]:
    """Share of samples whose component score reaches its pass threshold (`pass/<name>`)."""
    if not trajs:
        return {}
    return {
        f"{prefix}pass/{name}": sum(t.reward_components.get(name, 0.0) >= th and not t.failed for t in trajs)
        / len(trajs)
        for name, th in thresholds.items()
    }


def sample_records(
    trajs: list[Trajectory], k: int, tokenizer: Any = None, stats: Mapping[int, SampleStats] | None = None
) -> list[dict[str, Any]]:
    """samples.jsonl rows for the first k trajectories. With a tokenizer, also the per-token view the report
    colours (token_records), with what the trainer measured of each (`stats`, by sample_id)."""
    stats = stats or {}
    return [
        {
            "prompt": t.prompt_text[-400:],
            "completion": t.completion_text,
            "reward": t.reward,
            "components": t.reward_components,
            "passed": t.passed,
            "error": t.error,
            "tokens": t.num_completion_tokens,
            "policy_version": t.policy_version,
            **({"feedback": t.feedback, "feedback_turn": t.feedback_turn} if t.feedback else {}),
            **({"messages": t.messages} if t.messages is not None else {}),
            **(token_records(t, tokenizer, _stats_of(t, stats)) if tokenizer is not None else {}),
        }
        for t in trajs[:k]
    ]


def _stats_of(t: Trajectory, stats: Mapping[int, SampleStats]) -> SampleStats | None:
    return stats.get(t.sample_id) if t.sample_id is not None else None


def token_records(t: Trajectory, tokenizer: Any, stats: SampleStats | None = None) -> dict[str, Any]:
    """Everything after the first prompt, token by token: its text, whether the policy sampled it (mask 1) or the
    env inserted it (0: tool results, later user turns), the sampler's log-prob, and what the trainer measured
    (`stats`, the StepResult's stats): its log-prob before the update and the sequence's advantage."""
    ids, mask, logps = t.sequence()
    ids = ids[len(t.prompt_ids) :]
    out: dict[str, Any] = {
        "token_text": tokenizer.batch_decode([[i] for i in ids]),
        "token_mask": mask,
        "token_logprobs": [round(x, 4) for x in logps],
    }
    if stats is not None and stats.learner_logprobs is not None:
        out["token_learner_logprobs"] = stats.learner_logprobs
    if stats is not None and stats.advantage is not None:
        out["advantage"] = stats.advantage
    return out
