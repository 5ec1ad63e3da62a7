"""The orchestrator: a Run drives a Stepper (policy gradient or ES); collectors, batch assembly, weight sync,
evaluation, checkpoints. See docs/architecture.md."""

from posttrain.loop.run import Run, RunResult, Stepper, train

__all__ = ["Run", "RunResult", "Stepper", "train"]
