"""Synthetic metric streams with the loop's metric names: a healthy run, and edits that make it stall."""

import random

STALL_AT = 11  # first step of the bad condition in every stall stream


def healthy(step: int, rng: random.Random) -> dict:
    """A run that learns: reward and pass rate rise, a quarter of the groups without variance, steady entropy."""
    p = min(0.9, 0.15 + 0.02 * step)
    return {"kind": "train", "step": step, "reward/mean": 0.4 + 0.9 * p + rng.uniform(-0.05, 0.05),
            "reward/std": 0.3, "pass_rate": p, "groups/zero_variance_frac": rng.choice([0.0, 0.25, 0.25, 0.5]),
            "train/entropy": 0.35 + rng.uniform(-0.05, 0.05), "completion/truncated_frac": rng.choice([0.0, 0.0625]),
            "completion/len_mean": 40 + rng.uniform(-5, 5), "completion/len_max": 64.0,
            "train/sampler_kl_k3": 1e-4, "train/skipped_step": 0.0, "train/skipped_steps_total": 0.0,
            "perf/peak_rss_mb": 5400.0, "perf/rss_mb": 5100.0, "perf/mem_available_mb": 16000.0}


def stream(n: int = 30, bad=None, evals=None, seed: int = 0) -> list[dict]:
    """n train records; from STALL_AT on, `bad(record, step)` edits each; eval records from `evals(step)`."""
    rng = random.Random(seed)
    out = []
    for s in range(1, n + 1):
        r = healthy(s, rng)
        if bad and s >= STALL_AT:
            bad(r, s)
        out.append(r)
        if evals and s % 5 == 0:
            out.append({"kind": "eval", "step": s, "eval/pass_rate": evals(s)})
    if evals:
        out.insert(0, {"kind": "eval", "step": 0, "eval/pass_rate": evals(0)})
    return out


def _no_signal(r, s):  # the stall: every sample earns the same partial credit
    r.update({"groups/zero_variance_frac": 1.0, "reward/mean": 0.3, "reward/std": 0.0, "pass_rate": 0.0})


def _task_stalled(r, s):  # a mixture: task a learns, task b is stuck at partial credit with no pass
    r.update({"task/a/reward": 0.2 + 0.05 * s, "task/a/pass_rate": min(1.0, 0.05 * s),
              "task/b/reward": 0.3, "task/b/pass_rate": 0.0})


def _never_fires(r, s):
    r.update({"groups/zero_variance_frac": 1.0, "reward/mean": 0.0, "reward/std": 0.0, "pass_rate": 0.0})


def _saturated(r, s):
    r.update({"pass_rate": 1.0, "groups/zero_variance_frac": 1.0})


def _collapse(r, s):  # entropy halves each step and the samples of a prompt become the same
    r["train/entropy"] = 0.35 * 0.5 ** (s - STALL_AT + 2)
    r["groups/zero_variance_frac"] = 0.75


def _low_entropy_still_learning(r, s):  # a format-heavy task (JSON): near-certain tokens, groups still differ
    r["train/entropy"] = 0.01


def _blowup(r, s):
    r["train/entropy"] = 2.5


def _truncation(r, s):
    r["completion/truncated_frac"] = 0.8


def _runaway(r, s):
    r["completion/len_mean"] = 40 * 1.3 ** (s - STALL_AT + 2)


def _kl_spike(r, s):
    if s == STALL_AT:
        r["train/sampler_kl_k3"] = 0.4


def _is_spike(r, s):
    if s == STALL_AT:
        r["train/is_ratio_max"] = 55.0


def _failing(r, s):
    r.update({"rollouts/failed": 6.0, "rollouts/count": 8.0})


def _skipped(r, s):
    if s == STALL_AT:
        r.update({"train/skipped_step": 1.0, "train/loss": "nan"})
    r["train/skipped_steps_total"] = 1.0


def _plateau_stream() -> list[dict]:
    """Pass never fires; partial credit climbs to 0.3 by step 10, then is flat (with noise, and groups that
    still differ, so this is not `no_signal`)."""
    rng = random.Random(1)
    out = []
    for s in range(1, 31):
        r = healthy(s, rng)
        r.update({"pass_rate": 0.0, "reward/mean": min(0.3, 0.03 * s) + rng.uniform(-0.02, 0.02),
                  "groups/zero_variance_frac": 0.5})
        out.append(r)
    return out


def _memory(r, s):  # another job on the machine takes memory: 600 MB left at this run's peak
    r.update({"perf/mem_available_mb": 900.0})
