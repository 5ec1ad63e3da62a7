"""Running one trial: `posttrain train` in a subprocess with a wall-clock timeout.

A crash, a hang or an out-of-memory kill ends only that subprocess (the trial fails; the search goes on). While it
runs, the runner polls RUN_DIR/metrics.jsonl for held-out evals and hands each to `on_eval(step, value)`; a true
answer (the proposer pruned the trial) stops the subprocess. The metric is read from summary.json afterwards.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

OnEval = Callable[[int, float], bool]


@dataclass
class TrialSpec:
    name: str  # the run directory's name under the search's trials/
    overrides: list[str]  # key=value, the trial's params, set: and budget included (not run.*)
    seed: int
    timeout_s: float
    trials_dir: Path
    log_path: Path
    # Set by the search when this run's sibling seed was pruned or failed: the run stops as pruned (parallel seeds).
    cancel: threading.Event | None = None

    @property
    def run_dir(self) -> Path:
        return self.trials_dir / self.name


@dataclass
class Outcome:
    status: str  # ok | failed | timeout | pruned
    value: float | None
    run_dir: Path
    wall_s: float
    error: str = ""
    evals: list[tuple[int, float]] = field(default_factory=list)


class TrialRunner(Protocol):
    def __call__(self, spec: TrialSpec, on_eval: OnEval | None = None) -> Outcome: ...


def read_metric(run_dir: Path, metric: str) -> float | None:
    """The metric of a finished run: summary.json's "after" (held-out), a top-level summary key, or else the
    last train record in metrics.jsonl that has it."""
    path = run_dir / "summary.json"
    if path.exists():
        try:
            s = json.loads(path.read_text())
        except json.JSONDecodeError:
            s = {}
        for src in (s.get("after") or {}, s):
            v = _num(src.get(metric))
            if v is not None:
                return v
    for r in reversed(_records(run_dir)):
        if r.get("kind") == "train" and _num(r.get(metric)) is not None:
            return _num(r[metric])
    return None


def _num(v: Any) -> float | None:
    if isinstance(v, bool):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if f == f and abs(f) != float("inf") else None


def _records(run_dir: Path) -> list[dict[str, Any]]:
    p = run_dir / "metrics.jsonl"
    if not p.exists():
        return []
    out = []
    for line in p.read_text(errors="replace").splitlines():
        try:
            r = json.loads(line)
        except json.JSONDecodeError:  # half-written last line
            continue
        if isinstance(r, dict):
            out.append(r)
    return out


def _tail(path: Path, n: int = 4) -> str:
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return " | ".join(lines[-n:])[-600:]


class SubprocessRunner:
    """`python -m posttrain.cli train [BASE_CONFIG] overrides... run.output_dir=... run.name=... run.seed=...`."""

    def __init__(
        self, metric: str, base_config: Path | None = None, command: list[str] | None = None, poll_s: float = 1.0
    ):
        self.metric, self.base_config, self.poll_s = metric, base_config, poll_s
        self.command = command or [sys.executable, "-m", "posttrain.cli", "train"]

    def argv(self, spec: TrialSpec) -> list[str]:
        cfg = [str(Path(self.base_config).resolve())] if self.base_config else []
        return [
            *self.command,
            *cfg,
            *spec.overrides,
            f"run.output_dir={spec.trials_dir.resolve()}",
            f"run.name={spec.name}",
            f"run.seed={spec.seed}",
        ]

    def __call__(self, spec: TrialSpec, on_eval: OnEval | None = None) -> Outcome:
        spec.trials_dir.mkdir(parents=True, exist_ok=True)
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        seen: set[int] = set()
        evals: list[tuple[int, float]] = []
        status, error = "ok", ""
        with open(spec.log_path, "w") as log:
            log.write("$ " + " ".join(self.argv(spec)) + "\n")
            log.flush()
            # its own session: a timeout or a prune kills the trial and everything it started, nothing else
            p = subprocess.Popen(
                self.argv(spec),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
            try:
                while True:
                    try:
                        rc = p.wait(timeout=self.poll_s)
                        break
                    except subprocess.TimeoutExpired:
                        pass
                    if on_eval is not None and self._new_evals(spec.run_dir, seen, evals, on_eval):
                        status, error = "pruned", f"pruned at step {evals[-1][0]} ({self.metric}={evals[-1][1]:.4g})"
                        _kill(p)
                        rc = None
                        break
                    if spec.cancel is not None and spec.cancel.is_set():
                        status, error = "pruned", "stopped: the trial's other seed was pruned or failed"
                        _kill(p)
                        rc = None
                        break
                    if time.monotonic() - t0 > spec.timeout_s:
                        status, error = "timeout", f"timed out after {spec.timeout_s:.0f}s (budget.trial.timeout_s)"
                        _kill(p)
                        rc = None
                        break
            finally:
                if p.poll() is None:  # Ctrl-C or an error in the search itself: take the trial down with it
                    _kill(p)
        wall = time.monotonic() - t0
        if status != "ok":
            return Outcome(status, None, spec.run_dir, wall, error, evals)
        assert rc is not None  # status "ok": the loop ended on p.wait()
        if rc != 0:
            how = f"killed by signal {-rc}" if rc < 0 else f"exit code {rc}"
            return Outcome("failed", None, spec.run_dir, wall, f"{how}: {_tail(spec.log_path)}", evals)
        value = read_metric(spec.run_dir, self.metric)
        if value is None:
            return Outcome(
                "failed",
                None,
                spec.run_dir,
                wall,
                f"no {self.metric!r} in {spec.run_dir}/summary.json or metrics.jsonl",
                evals,
            )
        return Outcome("ok", value, spec.run_dir, wall, "", evals)

    def _new_evals(self, run_dir: Path, seen: set[int], evals: list, on_eval: OnEval) -> bool:
        for r in _records(run_dir):
            step, v = r.get("step"), _num(r.get(self.metric))
            if r.get("kind") != "eval" or not isinstance(step, int) or step <= 0 or step in seen or v is None:
                continue
            seen.add(step)
            evals.append((step, v))
            if on_eval(step, v):
                return True
        return False


def _kill(p: subprocess.Popen, grace_s: float = 10.0) -> None:
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 30.0)):
        try:
            os.killpg(p.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            p.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue
