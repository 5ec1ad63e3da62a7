"""Diagnostics: notice when a run stops learning, say why, and say what to do.

A `Diagnostics` object is fed the records the loop writes to metrics.jsonl (`"kind": "train"` each step,
`"kind": "eval"` each held-out evaluation) and returns the `DiagnosticEvent`s that this record started or
cleared. Each diagnostic is a pure function of the history and the thresholds (`diagnostics.*` config keys), registered
by name in `DIAGNOSTICS` (obs/diagnostic_registry.py; the checks live in obs/diagnostic_checks.py): adding one is a
function and a test, never an elif. The state machine here only turns "the condition holds now" into events: one `start`
when it begins, one `clear` once it has been gone for `clear_after` steps, so a progress line is printed once, not every
step.

`posttrain diagnose RUN_DIR` replays a run's metrics.jsonl through the same object (obs/diagnose_run.py), so a
finished run, a running one and the live loop all give the same verdicts.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from posttrain.config.schema import DiagnosticsConfig
from posttrain.obs import diagnostic_checks  # noqa: F401 - the checks register themselves on import
from posttrain.obs.diagnostic_registry import DIAGNOSTICS, DiagnosticEvent, History

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
                open_[e.name] = {
                    "name": e.name,
                    "start_step": e.step,
                    "end_step": None,
                    "verdict": e.verdict,
                    "advice": e.advice,
                    "evidence": e.evidence,
                }
                out.append(open_[e.name])
            elif e.name in open_:
                open_.pop(e.name)["end_step"] = e.step
        return out

    # Resume: the loop can either replay the kept metrics.jsonl (replay) or save/restore this state.
    def state_dict(self) -> dict[str, Any]:
        return {
            "train": self.history.train,
            "evals": self.history.evals,
            "active": {k: asdict(v) for k, v in self.active.items()},
            "misses": dict(self._misses),
            "events": [asdict(e) for e in self.events],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history = History()
        for r in state["evals"]:
            self.history.add(r)
        for r in state["train"]:
            self.history.add(r)
        self.active = {k: DiagnosticEvent(**v) for k, v in state["active"].items()}
        self._misses = dict(state["misses"])
        self.events = [DiagnosticEvent(**e) for e in state["events"]]
