"""`posttrain diagnose RUN_DIR`: the live diagnostics' verdicts for a finished or running run, from its files.

It reads only RUN_DIR/metrics.jsonl and RUN_DIR/config.yaml (for the run's `diagnostics` thresholds) and
replays the train and eval records through `Diagnostics`, so it prints exactly what the live loop printed
(or would have: runs from before diagnostics existed get the same verdicts).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posttrain.config.schema import DiagnosticsConfig
from posttrain.errors import MissingFileError
from posttrain.obs.diagnostics import Diagnostics


@dataclass
class RunDiagnosis:
    run_dir: Path
    train_steps: int
    evals: int
    episodes: list[dict[str, Any]]  # Diagnostics.summary(): name, start_step, end_step, verdict, advice, evidence
    last_step: int

    @classmethod
    def of(cls, run_dir: Path, diag: Diagnostics) -> RunDiagnosis:
        """From the live loop's Diagnostics (for the end-of-run summary: print(render(RunDiagnosis.of(...))))."""
        return cls(Path(run_dir), len(diag.history.train), len(diag.history.evals), diag.summary(), diag.history.step)

    @property
    def healthy(self) -> bool:
        return not self.episodes

    @property
    def active(self) -> list[dict[str, Any]]:
        return [e for e in self.episodes if e["end_step"] is None]

    def to_json(self) -> dict[str, Any]:
        return {
            "run_dir": str(self.run_dir),
            "train_steps": self.train_steps,
            "evals": self.evals,
            "last_step": self.last_step,
            "healthy": self.healthy,
            "diagnostics": self.episodes,
        }


def read_records(run_dir: Path) -> list[dict[str, Any]]:
    """metrics.jsonl, tolerating a half-written last line (the run may still be writing)."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        raise MissingFileError(f"no metrics.jsonl in {run_dir}")
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def run_config(run_dir: Path) -> DiagnosticsConfig:
    """The run's own thresholds (config.yaml `diagnostics:`), defaults where it has none."""
    path = Path(run_dir) / "config.yaml"
    if not path.exists():
        return DiagnosticsConfig()
    import yaml

    section = (yaml.safe_load(path.read_text()) or {}).get("diagnostics") or {}
    return DiagnosticsConfig(**section)


def diagnose(run_dir: Path, cfg: DiagnosticsConfig | None = None) -> RunDiagnosis:
    records = read_records(run_dir)
    cfg = (cfg or run_config(run_dir)).model_copy(update={"enabled": True})
    d = Diagnostics(cfg)
    d.replay(records)
    return RunDiagnosis.of(run_dir, d)


def render(diag: RunDiagnosis) -> str:
    """Plain text, one block per episode in the live progress lines' format (a table folds the advice into a
    column a few words wide on an 80-column terminal)."""
    head = f"{diag.run_dir}: {diag.train_steps} train steps, {diag.evals} evals"
    if diag.healthy:
        return f"{head}: healthy, no diagnostic fired"
    lines = [f"{head}: {len(diag.episodes)} diagnostic(s), {len(diag.active)} active at step {diag.last_step}"]
    for e in diag.episodes:
        steps = (
            f"steps {e['start_step']}-{e['end_step']}"
            if e["end_step"] is not None
            else f"since step {e['start_step']}, active"
        )
        lines += [f"[{e['name']}] {steps}: {e['verdict']}", f"    -> {e['advice']}"]
    return "\n".join(lines)
