"""The orchestrator: the synchronous RL loop, evaluation, checkpoints."""

from posttrain.loop.rl_loop import RLLoop, RunResult, train

__all__ = ["RLLoop", "RunResult", "train"]
