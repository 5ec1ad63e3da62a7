"""Experiment-tracker sinks beside metrics.jsonl and TensorBoard: trackio and Weights & Biases, both optional.

    logging.trackio=true   trackio.init(project, name, config) -> run.log(numbers, step) -> run.finish()
    logging.wandb=true     wandb.init(project, name, dir=RUN_DIR, config) -> run.log(numbers, step) -> run.finish()

Off by default. A tracker that is not installed, fails to start or fails to log prints one warning and is dropped:
metrics.jsonl is the record of a run, a tracker is a view of it, so it never stops training. W&B honours its own
environment (WANDB_MODE=offline logs to RUN_DIR/wandb without an account).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any


class TrackerSink:
    """One tracker run. `module` is the tracker's package name; both expose init() -> run with log/finish."""

    def __init__(self, module: str, project: str, name: str, config: dict[str, Any], run_dir: str | None = None):
        self.module = module
        self.run = None
        try:
            mod = importlib.import_module(module)
        except ImportError:
            _warn(
                f"logging.{module}=true but {module} is not installed (pip install 'posttrain[{module}]'); "
                "metrics go to metrics.jsonl only"
            )
            return
        try:
            kwargs: dict[str, Any] = {"project": project, "name": name, "config": config}
            if module == "wandb" and run_dir is not None:
                kwargs["dir"] = run_dir  # wandb's files inside the run directory, not the working directory
            self.run = mod.init(**kwargs)
        except Exception as e:  # noqa: BLE001 - e.g. no login, no network: train without the tracker
            _warn(f"{module} failed to start ({type(e).__name__}: {e}); metrics go to metrics.jsonl only")

    def log(self, record: dict[str, Any]) -> None:
        if self.run is None:
            return
        numbers = numeric(record)
        if not numbers:
            return
        try:
            self.run.log(numbers, step=int(record.get("step", 0)))
        except Exception as e:  # noqa: BLE001 - a tracker that fails must not stop the run: it is dropped
            _warn(f"{self.module} log failed ({type(e).__name__}: {e}); dropping it for the rest of the run")
            self.run = None

    def close(self) -> None:
        if self.run is None:
            return
        try:
            self.run.finish()
        except Exception as e:  # noqa: BLE001 - a tracker that fails to finish must not fail the run's end
            _warn(f"{self.module} finish failed: {e}")
        self.run = None


def numeric(record: dict[str, Any]) -> dict[str, float]:
    """The record's numbers, keyed as in metrics.jsonl (train keys as they are, eval keys already `eval/...`);
    a non-train record's other keys get its kind as a prefix, so a remedy's numbers do not overwrite a metric."""
    kind = record.get("kind", "train")
    out = {}
    for k, v in record.items():
        if k in ("step", "kind") or isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        out[k if kind in ("train", "eval") or "/" in k else f"{kind}/{k}"] = float(v)
    return out


def tracker_sinks(cfg: Any, run_dir: Path) -> list[TrackerSink]:
    """The sinks a Config asks for (logging.trackio, logging.wandb), each started."""
    lg = cfg.logging
    wanted = [m for m, on in (("trackio", lg.trackio), ("wandb", lg.wandb)) if on]
    if not wanted:
        return []
    config = cfg.model_dump(mode="json")
    return [TrackerSink(m, lg.project, Path(run_dir).name, config, run_dir=str(run_dir)) for m in wanted]


_warned: set[str] = set()


def _warn(msg: str) -> None:
    if msg not in _warned:  # once per message: a tracker failing every step must not flood the console
        _warned.add(msg)
        print(f"[posttrain] warning: {msg}", file=sys.stderr)
