"""What a diagnostic is and where it is registered: the types the checks (obs/diagnostic_checks.py) and the
state machine (obs/diagnostics.py) share, and the `DIAGNOSTICS` registry the `@diagnostic` decorator fills."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from posttrain.config.schema import DiagnosticsConfig


@dataclass(frozen=True)
class Finding:
    """A condition that holds now: what is wrong (with the numbers) and what to do about it."""

    verdict: str
    advice: str
    evidence: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class DiagnosticEvent:
    name: str
    state: Literal["start", "clear"]
    step: int
    verdict: str
    advice: str
    evidence: dict[str, float] = field(default_factory=dict)

    def to_record(self) -> dict[str, Any]:
        """The metrics.jsonl line (`"kind": "diagnostic"`; it carries `step`, so resume truncation keeps it right)."""
        return {"kind": "diagnostic", **asdict(self)}

    def line(self) -> str:
        """The one progress-output line (plus the advice) printed when the event happens."""
        if self.state == "clear":
            return f"diagnostic cleared at step {self.step} [{self.name}]"
        return f"diagnostic at step {self.step} [{self.name}]: {self.verdict}\n    -> {self.advice}"


class History:
    """The train and eval records seen so far, with numeric look-ups that skip records lacking a key.

    Each train metric's values are kept as a list as records arrive, so a check costs O(window), not O(steps):
    replaying a 10,000-step run stays fast."""

    def __init__(self) -> None:
        self.train: list[dict[str, Any]] = []
        self.evals: list[dict[str, Any]] = []
        self._series: dict[str, list[float]] = {}

    def add(self, record: dict[str, Any]) -> None:
        if record.get("kind") == "eval":
            self.evals.append(record)
            return
        self.train.append(record)
        for k, v in record.items():
            if k not in ("kind", "step"):
                self._series.setdefault(k, []).append(metric_float(v))

    def series(self, key: str) -> list[float]:
        """Every train value of key, in order (non-numbers read as nan). Do not modify the returned list."""
        return self._series.get(key, [])

    def keys(self) -> list[str]:
        """Every train metric seen so far."""
        return list(self._series)

    def last(self, key: str, n: int) -> list[float]:
        """The last n values of key, or [] when there are fewer than n (a condition needs n steps of evidence)."""
        s = self.series(key)
        return s[-n:] if len(s) >= n else []

    @property
    def step(self) -> int:
        recs = self.train[-1:] + self.evals[-1:]
        return int(max((r.get("step", 0) for r in recs), default=0))


def metric_float(v: Any) -> float:
    """A metric as the checks read it: a float, nan where it is not a number (diagnostic_checks.py uses it too)."""
    # metrics.jsonl writes non-finite floats as strings ("nan", "inf"): read them back as floats.
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


Check = Callable[[History, DiagnosticsConfig], "Finding | None"]


@dataclass(frozen=True)
class Diagnostic:
    name: str
    check: Check
    on: Literal["train", "eval"]  # which records it is evaluated on


DIAGNOSTICS: dict[str, Diagnostic] = {}


def diagnostic(name: str, on: Literal["train", "eval"] = "train") -> Callable[[Check], Check]:
    def register(fn: Check) -> Check:
        DIAGNOSTICS[name] = Diagnostic(name, fn, on)
        return fn

    return register
