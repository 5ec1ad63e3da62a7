"""The orchestrator: a Run drives a Stepper (policy gradient or ES); collectors, batch assembly, weight sync,
evaluation, checkpoints. See docs/architecture.md."""

from posttrain.loop.run import Run, RunResult, train
from posttrain.loop.stepper import Stepper, StepResult

__all__ = ["Run", "RunResult", "StepResult", "Stepper", "train"]
