"""Staleness admission for the async loop, as pure functions.

Group i (in the deterministic data order) is trained at step i // P, with the weights of policy version
i // P (version = optimizer steps done). Admitting it for generation only once the sampler's version is at least
i // P - max_staleness bounds every trained token's age by max_staleness versions, without generating anything
that is later thrown away. With max_staleness = k, groups of k + 1 consecutive steps can be in flight at once,
so when rollouts are latency-bound (slow envs) the speed-up over the synchronous loop is at most k + 1.
"""

from __future__ import annotations

from collections import Counter


def train_step_of(group_index: int, per_step: int) -> int:
    return group_index // per_step


def admissible(group_index: int, per_step: int, sampler_version: int, max_staleness: int) -> bool:
    """May group `group_index` start generating at `sampler_version`?"""
    return sampler_version >= train_step_of(group_index, per_step) - max_staleness


def staleness_metrics(trainer_version: int, token_versions: list[int]) -> dict[str, float]:
    """Histogram (share of sequences per age) plus mean / max age, in policy versions."""
    if not token_versions:
        return {}
    ages = [trainer_version - v for v in token_versions]
    hist = Counter(ages)
    out = {f"async/staleness_frac/{age}": n / len(ages) for age, n in sorted(hist.items())}
    out.update({"async/staleness_mean": sum(ages) / len(ages), "async/staleness_max": float(max(ages))})
    return out


def token_staleness_metrics(trainer_version: int, trajectories: list) -> dict[str, float]:
    """Per token: mean age in policy versions; the share of sequences whose tokens span more than one version (a
    sync landed during the episode: between turns, or inside one); and the share with a model call that a sync
    interrupted (loop.interruptible: its own tokens span versions)."""
    turns = [[t.versions() for t in traj.turns] for traj in trajectories]
    ages = [trainer_version - v for seq in turns for vs in seq for v in vs]
    if not ages:
        return {}
    mixed = sum(1 for seq in turns if len({v for vs in seq for v in vs}) > 1)
    interrupted = sum(1 for seq in turns if any(len(set(vs)) > 1 for vs in seq))
    return {
        "async/token_staleness_mean": sum(ages) / len(ages),
        "async/mixed_version_frac": mixed / len(turns),
        "async/interrupted_frac": interrupted / len(turns),
    }
