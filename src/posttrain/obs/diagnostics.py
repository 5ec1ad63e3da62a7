"""Diagnostics: notice when a run stops learning, say why, and say what to do.

A `Diagnostics` object is fed the records the loop writes to metrics.jsonl (`"kind": "train"` each step,
`"kind": "eval"` each held-out evaluation) and returns the `DiagnosticEvent`s that this record started or
cleared. Each diagnostic is a pure function of the history and the thresholds (`diagnostics.*` config keys),
registered by name in `DIAGNOSTICS` (the checks live in obs/diagnostic_checks.py): adding one is a function and a
test, never an elif. The state machine
here only turns "the condition holds now" into events: one `start` when it begins, one `clear` once it has
been gone for `clear_after` steps, so a progress line is printed once, not every step.

`posttrain diagnose RUN_DIR` replays a run's metrics.jsonl through the same object (obs/diagnose_run.py), so a
finished run, a running one and the live loop all give the same verdicts.
"""

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
                self._series.setdefault(k, []).append(_num(v))

    def series(self, key: str) -> list[float]:
        """Every train value of key, in order (non-numbers read as nan). Do not modify the returned list."""
        return self._series.get(key, [])

    def last(self, key: str, n: int) -> list[float]:
        """The last n values of key, or [] when there are fewer than n (a condition needs n steps of evidence)."""
        s = self.series(key)
        return s[-n:] if len(s) >= n else []

    @property
    def step(self) -> int:
        recs = self.train[-1:] + self.evals[-1:]
        return int(max((r.get("step", 0) for r in recs), default=0))


def _num(v: Any) -> float:
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


# ---- the state machine -------------------------------------------------------------------------------------

class Diagnostics:
    """Feed it every train and eval record, in order; it returns the events each record started or cleared."""

    def __init__(self, cfg: DiagnosticsConfig | None = None, names: list[str] | None = None):
        self.cfg = cfg or DiagnosticsConfig()
        self.diagnostics = [DIAGNOSTICS[n] for n in (names or DIAGNOSTICS)]
        self.history = History()
        self.active: dict[str, DiagnosticEvent] = {}
        self._misses: dict[str, int] = {}
        self.events: list[DiagnosticEvent] = []

    def observe(self, record: dict[str, Any]) -> list[DiagnosticEvent]:
        kind = record.get("kind")
        if kind not in ("train", "eval"):
            return []  # diagnostic, remedy and warm-start records say nothing about learning
        self.history.add(record)
        if not self.cfg.enabled:
            return []
        step = int(record.get("step", 0))
        out = []
        for d in self.diagnostics:
            if d.on != kind:
                continue
            found = d.check(self.history, self.cfg)
            if found is not None:
                self._misses[d.name] = 0
                if d.name not in self.active:
                    ev = DiagnosticEvent(d.name, "start", step, found.verdict, found.advice, found.evidence)
                    self.active[d.name] = ev
                    out.append(ev)
            elif d.name in self.active:
                self._misses[d.name] = self._misses.get(d.name, 0) + 1
                # Eval diagnostics are checked rarely: one good eval clears them.
                if d.on == "eval" or self._misses[d.name] >= self.cfg.clear_after:
                    started = self.active.pop(d.name)
                    out.append(DiagnosticEvent(d.name, "clear", step, f"cleared ({started.verdict})", "", {}))
        self.events += out
        return out

    def replay(self, records: list[dict[str, Any]]) -> list[DiagnosticEvent]:
        """Feed a whole metrics.jsonl (e.g. on resume, or `posttrain diagnose`); returns every event."""
        out = []
        for r in records:
            out += self.observe(r)
        return out

    def summary(self) -> list[dict[str, Any]]:
        """One entry per episode of each diagnostic (for summary.json and the final table): when it started,
        when it cleared (None: still active at the end), the verdict and the advice."""
        out: list[dict[str, Any]] = []
        open_: dict[str, dict[str, Any]] = {}
        for e in self.events:
            if e.state == "start":
                open_[e.name] = {"name": e.name, "start_step": e.step, "end_step": None, "verdict": e.verdict,
                                 "advice": e.advice, "evidence": e.evidence}
                out.append(open_[e.name])
            elif e.name in open_:
                open_.pop(e.name)["end_step"] = e.step
        return out

    # Resume: the loop can either replay the kept metrics.jsonl (replay) or save/restore this state.
    def state_dict(self) -> dict[str, Any]:
        return {"train": self.history.train, "evals": self.history.evals,
                "active": {k: asdict(v) for k, v in self.active.items()}, "misses": dict(self._misses),
                "events": [asdict(e) for e in self.events]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history = History()
        for r in state["evals"]:
            self.history.add(r)
        for r in state["train"]:
            self.history.add(r)
        self.active = {k: DiagnosticEvent(**v) for k, v in state["active"].items()}
        self._misses = dict(state["misses"])
        self.events = [DiagnosticEvent(**e) for e in state["events"]]


# The checks register themselves on import; imported last, so the registry and the types above already exist.
from posttrain.obs import diagnostic_checks  # noqa: E402,F401
