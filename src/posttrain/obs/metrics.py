"""Metric sinks: metrics.jsonl always, TensorBoard when installed, trackio / W&B when asked (obs/sinks.py).
A failing sink never blocks training."""

from __future__ import annotations

import json
import math
import os
import sys
from typing import Any

from posttrain.errors import MissingFileError


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v


class MetricsLogger:
    def __init__(self, run_dir: str, tensorboard: bool = True, sinks: list | None = None):
        """`sinks`: more trackers, each with log(record) and close() (obs/sinks.TrackerSink)."""
        self.run_dir = run_dir
        self.path = os.path.join(run_dir, "metrics.jsonl")
        self.samples_path = os.path.join(run_dir, "samples.jsonl")
        self._tb = None
        self.sinks = list(sinks or [])
        self.errors = 0
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(os.path.join(run_dir, "tb"))
            except Exception:  # noqa: BLE001 - TensorBoard is optional
                self._tb = None

    def log(self, record: dict[str, Any]) -> None:
        """Append one record (must hold `step` and `kind`)."""
        try:
            with open(self.path, "a") as f:
                f.write(json.dumps({k: _clean(v) for k, v in record.items()}) + "\n")
        except OSError as e:
            self._warn(f"metrics.jsonl write failed: {e}")
        if self._tb is not None:
            try:
                step = int(record.get("step", 0))
                for k, v in record.items():
                    if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step":
                        self._tb.add_scalar(k, v, step)
                self._tb.flush()
            except Exception as e:  # noqa: BLE001 - TensorBoard is a view of the run: a failed write drops it
                self._warn(f"tensorboard write failed: {e}")
                self._tb = None
        for sink in self.sinks:
            sink.log(record)  # each catches its own failures

    def log_samples(self, step: int, samples: list[dict[str, Any]]) -> None:
        try:
            with open(self.samples_path, "a") as f:
                for s in samples:
                    f.write(json.dumps({"step": step, **s}, default=str) + "\n")
        except OSError as e:
            self._warn(f"samples.jsonl write failed: {e}")

    def _warn(self, msg: str) -> None:
        self.errors += 1
        if self.errors <= 3:
            print(f"[posttrain] warning: {msg}", file=sys.stderr)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
        if self._tb is not None:
            try:
                self._tb.close()
            except Exception:  # noqa: BLE001 - closing an optional view must not fail the run's end
                pass


def read_metrics(run_dir: str) -> list[dict[str, Any]]:
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        raise MissingFileError(f"no metrics.jsonl in {run_dir}")
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
