"""The Run's watch over its own metrics: live diagnostics (obs/diagnostics.py) after every train and eval
record, and, when `diagnostics.remedies.enabled`, the remedies' overrides handed to the stepper.

    watch.observe(record, stepper)   log and print each diagnostic that starts or clears, each remedy change;
                                     the stepper samples and trains the next steps with the overrides
    watch.state_dict()               for the checkpoint, so a resumed run keeps its episodes and remedy level
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from posttrain.config.schema import Config
from posttrain.loop.stepper import Stepper
from posttrain.obs.diagnose_run import RunDiagnosis, render
from posttrain.obs.diagnostics import Diagnostics
from posttrain.obs.remedies import Remedies


class Watch:
    def __init__(
        self,
        cfg: Config,
        log: Callable[[dict[str, Any]], None],
        say: Callable[[str], None],
        has_format_hints: bool = False,
    ):
        self.log, self.say = log, say
        self.diag = Diagnostics(cfg.diagnostics) if cfg.diagnostics.enabled else None
        wants = cfg.diagnostics.enabled and cfg.diagnostics.remedies.enabled
        if wants and cfg.algorithm.stepper != "policy_gradient":
            say(
                f"note: diagnostics.remedies apply to policy-gradient runs; off for algorithm.stepper="
                f"{cfg.algorithm.stepper}"
            )
        pg = cfg.algorithm.stepper == "policy_gradient"
        self.remedies = Remedies.from_config(cfg, has_format_hints) if wants and pg else None

    def observe(self, record: dict[str, Any], stepper: Stepper) -> None:
        if self.diag is None:
            return
        events = self.diag.observe(record)
        for e in events:
            self.log(e.to_record())
            self.say(e.line())
        if self.remedies is None:
            return
        ov = self.remedies.update(record["step"], record, events)
        for ch in ov.changes:
            self.log(ch.to_record())
            self.say(ch.line())
        if ov.changes:
            stepper.apply_overrides(ov)

    def resume(self, state: dict[str, Any], stepper: Stepper) -> None:
        if self.diag is not None and "diagnostics" in state:
            self.diag.load_state_dict(state["diagnostics"])
        if self.remedies is not None and "remedies" in state:
            self.remedies.load_state_dict(state["remedies"])
            stepper.apply_overrides(self.remedies.current)

    def state_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.diag is not None:
            out["diagnostics"] = self.diag.state_dict()
        if self.remedies is not None:
            out["remedies"] = self.remedies.state_dict()
        return out

    def summary(self) -> list[dict[str, Any]]:
        return self.diag.summary() if self.diag is not None else []

    def report(self, run_dir: Path) -> str | None:
        """The end-of-run verdict block, when any diagnostic fired."""
        if self.diag is None or not self.diag.summary():
            return None
        return render(RunDiagnosis.of(run_dir, self.diag))
