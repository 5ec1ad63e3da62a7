"""Noise-aware keep/revert: pure functions, no I/O.

A candidate wins only when its mean beats the incumbent's mean by more than the noise: the spread (max - min) of
the incumbent's values over its seeds, or the program's `noise:` floor when that is larger. One seed that looks
like a win is not enough: `judge` answers "confirm" and the search re-runs the candidate on the second seed, then
asks again with both values.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from statistics import fmean
from typing import Literal


@dataclass(frozen=True)
class Verdict:
    action: Literal["accept", "reject", "confirm"]
    margin: float  # how much better the candidate's mean is (positive: better, in the program's direction)
    noise: float  # what the margin had to exceed
    reason: str


def spread(values: Sequence[float]) -> float:
    return max(values) - min(values) if len(values) >= 2 else 0.0


def improvement(candidate: float, incumbent: float, direction: str) -> float:
    """How much better `candidate` is than `incumbent` (negative: worse)."""
    return candidate - incumbent if direction == "max" else incumbent - candidate


def judge(
    candidate: Sequence[float],
    incumbent: Sequence[float],
    direction: str,
    noise_floor: float = 0.0,
    seeds_needed: int = 2,
) -> Verdict:
    """Accept, reject, or ask for another seed of the candidate.

    candidate / incumbent: the metric on each seed run so far (the incumbent's on two seeds when it could be
    measured). A candidate is accepted only with `seeds_needed` values and a margin above the noise.
    """
    if not candidate:
        raise ValueError("judge needs at least one candidate value")
    if not incumbent:
        raise ValueError("judge needs the incumbent's values")
    noise = max(noise_floor, spread(incumbent))
    margin = improvement(fmean(candidate), fmean(incumbent), direction)
    seeds = f"{len(candidate)} seed{'s' if len(candidate) > 1 else ''}"
    if margin <= noise:
        what = "within noise" if margin > 0 else ("no better" if margin == 0 else "worse")
        return Verdict(
            "reject", margin, noise, f"{what}: {margin:+.4g} vs the incumbent over {seeds} (needs > {noise:.4g})"
        )
    if len(candidate) < seeds_needed:
        return Verdict(
            "confirm",
            margin,
            noise,
            f"{margin:+.4g} > noise {noise:.4g} on {seeds}: re-run on another seed before accepting",
        )
    return Verdict("accept", margin, noise, f"better by {margin:+.4g} over {seeds} (noise {noise:.4g})")
