"""bench/async_vs_sync.py's time-to-reward: training seconds until a 5-step mean reward first reaches a target."""

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("async_bench",
                                               Path(__file__).resolve().parents[2] / "bench" / "async_vs_sync.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_time_to_reward_counts_walls_up_to_the_first_window_that_reaches_it():
    run = {"rewards": [0.0, 0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6], "step_walls": [1.0] * 8}
    assert bench.time_to_reward(run, 0.1) == 5.0  # mean of steps 1-5 is 0.12: reached at step 5
    assert bench.time_to_reward(run, 0.3) == 7.0  # steps 3-7: mean 0.3
    assert bench.time_to_reward(run, 0.9) is None
    assert bench._reach(None, 10.0) == "not reached" and bench._reach(5.0, 10.0) == "5.0 (0.50)"
