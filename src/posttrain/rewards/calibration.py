"""Calibration math: proper scoring rules and calibration error, as pure functions (no torch, no state).

    brier(probs, target)                  multi-class Brier score, sum_k (p_k - y_k)^2, in [0, 2]
    rlcr_reward(confidence, correct)      RLCR's reward, correct - (confidence - correct)^2, in [-1, 1]
    confidence_brier(confidence, correct) the binary Brier term (confidence - correct)^2, in [0, 1]
    reliability_bins(conf, correct, n)    per-bin mean confidence, accuracy and count (a reliability diagram)
    ece(conf, correct, n_bins=10)         expected calibration error, sum_b n_b/N |acc_b - conf_b|, in [0, 1]

`correct` may be fractional (the share of annotators who agree with the chosen label, for an ambiguous item):
every function here is then the expectation over annotators, and the proper scoring rules stay proper (their
expected value is still maximised by reporting the true probability).

Why no log score: -log p is unbounded, so one confident miss (p ~ 0 on the gold label) outweighs any number of
good answers and blows up a group's advantages; a small model writes exact zeros often. Brier and RLCR are
strictly proper AND bounded (RLCR, Damani et al. 2025, "Beyond Binary Rewards", arXiv:2507.16806).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


def brier(probs: Mapping[str, float], target: Mapping[str, float] | str) -> float:
    """Multi-class Brier score of `probs` (label -> probability; missing labels are 0) against `target` (the gold
    label, or a gold distribution label -> probability). 0 is perfect; 2 is a sure answer on a wrong label."""
    gold = {target: 1.0} if isinstance(target, str) else dict(target)
    return float(sum((float(probs.get(k, 0.0)) - float(gold.get(k, 0.0))) ** 2 for k in set(probs) | set(gold)))


def confidence_brier(confidence: float, correct: float) -> float:
    """The binary Brier term of a stated confidence: (confidence - correct)^2, in [0, 1]."""
    return (float(confidence) - float(correct)) ** 2


def rlcr_reward(confidence: float, correct: float) -> float:
    """RLCR's reward: correctness minus the Brier term of the stated confidence, in [-1, 1]. For a fixed chance
    of being right p its expectation, p - (q^2 - 2qp + p), peaks at confidence q = p."""
    return float(correct) - confidence_brier(confidence, correct)


@dataclass(frozen=True)
class Bin:
    """One reliability-diagram bin: confidences in [lo, hi) (the last bin includes 1.0)."""

    lo: float
    hi: float
    count: int
    conf_mean: float  # NaN when empty
    accuracy: float  # NaN when empty


def bin_index(confidence: float, n_bins: int) -> int:
    """The bin of a confidence in [0, 1]: equal-width bins, 1.0 in the last one. Out-of-range values are clamped."""
    c = min(1.0, max(0.0, float(confidence)))
    return min(n_bins - 1, int(c * n_bins))


def reliability_bins(confidences: Sequence[float], correct: Sequence[float], n_bins: int = 10) -> list[Bin]:
    """Equal-width bins over [0, 1]: per bin the mean stated confidence, the accuracy (mean correctness) and the
    count. A calibrated model's bins lie on the diagonal accuracy == confidence."""
    if len(confidences) != len(correct):
        raise ValueError(f"{len(confidences)} confidences but {len(correct)} correctness values")
    if n_bins < 1:
        raise ValueError(f"n_bins must be >= 1, got {n_bins}")
    n = [0] * n_bins
    conf_sum = [0.0] * n_bins
    acc_sum = [0.0] * n_bins
    for c, y in zip(confidences, correct):
        b = bin_index(c, n_bins)
        n[b] += 1
        conf_sum[b] += min(1.0, max(0.0, float(c)))
        acc_sum[b] += float(y)
    return [
        Bin(
            b / n_bins,
            (b + 1) / n_bins,
            n[b],
            conf_sum[b] / n[b] if n[b] else math.nan,
            acc_sum[b] / n[b] if n[b] else math.nan,
        )
        for b in range(n_bins)
    ]


def ece_from_bins(bins: Sequence[Bin]) -> float:
    """Expected calibration error from bins: the count-weighted mean |accuracy - confidence|. 0 when empty."""
    total = sum(b.count for b in bins)
    if total == 0:
        return 0.0
    return float(sum(b.count * abs(b.accuracy - b.conf_mean) for b in bins if b.count) / total)


def ece(confidences: Sequence[float], correct: Sequence[float], n_bins: int = 10) -> float:
    """Expected calibration error (Guo et al. 2017), `n_bins` equal-width bins over [0, 1], in [0, 1]."""
    return ece_from_bins(reliability_bins(confidences, correct, n_bins))


def bins_from_sums(sums: Mapping[str, float], prefix: str = "decision/rel/", n_bins: int = 10) -> list[Bin]:
    """Reliability bins from logged per-bin sums (`{prefix}b{k}/n`, `/conf_sum`, `/correct_sum`, as
    rewards/decision.py logs them: sums, so the records of several sources or steps add up)."""
    out = []
    for b in range(n_bins):
        n = int(sums.get(f"{prefix}b{b}/n", 0) or 0)
        conf = float(sums.get(f"{prefix}b{b}/conf_sum", 0.0) or 0.0)
        acc = float(sums.get(f"{prefix}b{b}/correct_sum", 0.0) or 0.0)
        out.append(Bin(b / n_bins, (b + 1) / n_bins, n, conf / n if n else math.nan, acc / n if n else math.nan))
    return out
