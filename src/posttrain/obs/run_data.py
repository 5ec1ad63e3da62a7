"""A run directory read back for the report: metrics.jsonl, samples.jsonl, trace.jsonl and summary.json, whatever
of them exists (a crashed or still-running run loads too, with notes on what is missing)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posttrain.errors import PosttrainError
from posttrain.obs.trace import read_trace


class ReportError(PosttrainError, ValueError):
    """Bad input to the report (not a run directory, a missing run in --compare): a clear message, no traceback."""


@dataclass
class RunData:
    run_dir: Path
    records: list[dict[str, Any]] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)
    trace: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)  # what is missing, shown at the top of the page

    @property
    def name(self) -> str:
        return self.run_dir.name

    @property
    def train(self) -> list[dict[str, Any]]:
        return [r for r in self.records if r.get("kind") == "train"]

    @property
    def evals(self) -> list[dict[str, Any]]:
        return [r for r in self.records if r.get("kind") == "eval"]

    @classmethod
    def load(cls, run_dir: str | Path) -> RunData:
        d = Path(run_dir)
        if not d.is_dir():
            raise ReportError(f"run directory not found: {d}")
        known = ["config.yaml", "metrics.jsonl", "samples.jsonl", "trace.jsonl", "summary.json"]
        if not any((d / f).exists() for f in known):
            raise ReportError(f"{d} is not a run directory (none of {', '.join(known)} in it)")
        run = cls(d, _jsonl(d / "metrics.jsonl"), _jsonl(d / "samples.jsonl"), read_trace(d))
        if (d / "summary.json").exists():
            try:
                run.summary = json.loads((d / "summary.json").read_text())
            except json.JSONDecodeError:
                run.notes.append("summary.json is not valid JSON")
        if not run.train:
            run.notes.append(
                "no train steps in metrics.jsonl yet: the run crashed or stopped before step 1, or is still starting"
            )
        elif run.summary is None:
            run.notes.append(
                f"no summary.json: the run is still going or stopped early (last step {run.train[-1].get('step')})"
            )
        if not run.trace:
            run.notes.append("no trace.jsonl: no timeline (runs from before tracing existed have none)")
        return run

    def series(self, key: str, records: list[dict[str, Any]] | None = None) -> tuple[list[int], list[float]]:
        """(steps, values) of key over the records that have it as a number ("nan" strings read as gaps)."""
        xs, ys = [], []
        for r in self.train if records is None else records:
            if key in r:
                xs.append(r.get("step", 0))
                ys.append(finite_float(r[key]))
        return xs, ys

    def keys(self, prefix: str, records: list[dict[str, Any]] | None = None) -> list[str]:
        recs = self.train if records is None else records
        return sorted({k for r in recs for k, v in r.items() if k.startswith(prefix) and _is_num(v)})


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            r = json.loads(line)
        except json.JSONDecodeError:  # a half-written last line of a crashed or running run
            continue
        if isinstance(r, dict):
            out.append(r)
    return out


def finite_float(v: Any) -> float | None:
    """A value as a plotted number: a finite float, else None (html_report.py reads its runs' values with it)."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


# ---- the page ----------------------------------------------------------------------------------------------
