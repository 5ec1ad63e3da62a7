"""Observability: stage timers, metrics sinks, console progress, run directories, reports."""

from posttrain.obs.metrics import MetricsLogger, read_metrics
from posttrain.obs.timers import StageTimer

__all__ = ["MetricsLogger", "StageTimer", "read_metrics"]
