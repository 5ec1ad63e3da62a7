"""A judge's counters, drained into a step's metrics (`drain_metrics`, rewards/telemetry.py).

Every value is additive (counts and summed seconds), so the counters of several judges add up; the two ratios,
`judge/cache_hit` (share of lookups answered by the cache) and `judge/latency` (mean seconds per judge call, i.e.
per batch sent to the backend), are derived from the sums by `with_ratios`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

# ratio key -> (numerator key, denominator key)
RATIOS: dict[str, tuple[str, str]] = {
    "judge/cache_hit": ("judge/cache_hits", "judge/lookups"),
    "judge/latency": ("judge/latency_total_s", "judge/calls"),
}


@dataclass
class JudgeStats:
    lookups: int = 0  # questions asked (each answered by the cache or the backend)
    cache_hits: int = 0
    calls: int = 0  # backend calls (one per batch attempt)
    latency_total_s: float = 0.0
    retries: int = 0
    failures: int = 0  # questions that ended without an answer (their samples fail)
    timeouts: int = 0
    pairs: int = 0  # pairwise comparisons asked in both orders
    position_flips: int = 0  # ... whose two orders disagreed (position bias)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **counts: float) -> None:
        with self._lock:
            for k, v in counts.items():
                setattr(self, k, getattr(self, k) + v)

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            return self._as_metrics()

    def drain(self) -> dict[str, float]:
        """The counters as `judge/*` metrics (with the ratios), then reset to zero."""
        with self._lock:
            m = self._as_metrics()
            for name in (
                "lookups",
                "cache_hits",
                "calls",
                "retries",
                "failures",
                "timeouts",
                "pairs",
                "position_flips",
            ):
                setattr(self, name, 0)
            self.latency_total_s = 0.0
        return m

    def _as_metrics(self) -> dict[str, float]:
        m = {
            f"judge/{k}": float(getattr(self, k))
            for k in (
                "lookups",
                "cache_hits",
                "calls",
                "latency_total_s",
                "retries",
                "failures",
                "timeouts",
                "pairs",
                "position_flips",
            )
        }
        return with_ratios(m)

    def __getstate__(self) -> dict:
        d = dict(self.__dict__)
        d.pop("_lock", None)
        return d

    def __setstate__(self, d: dict) -> None:
        self.__dict__.update(d)
        self._lock = threading.Lock()


def with_ratios(m: dict[str, float]) -> dict[str, float]:
    """Add (or recompute) the ratio metrics from their additive parts; a ratio with a zero denominator is left
    out (no lookups: no hit rate to report)."""
    out = dict(m)
    for key, (num, den) in RATIOS.items():
        if num in out and out.get(den, 0.0) > 0:
            out[key] = out[num] / out[den]
        else:
            out.pop(key, None)
    return out
