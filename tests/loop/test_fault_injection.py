"""Whole runs with `debug.rollout_fault_rate` (envs/faults.py): a share of training rollouts raise, and the run still
finishes every step, with the failures counted in metrics.jsonl and kept out of training."""

import subprocess
import sys

import pytest
import yaml

from posttrain.config import ConfigError, load_config
from posttrain.loop import train
from posttrain.obs import read_metrics

FAST = ["model.name=tiny-random", "task.name=count-a", "logging.tensorboard=false", "logging.console=false",
        "loop.eval_prompts=4", "loop.save_every=0", "loop.steps=4", "loop.prompts_per_step=3",
        "algorithm.num_generations=4", "debug.rollout_fault_rate=0.3"]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_run_with_injected_faults_finishes_every_step(tmp_path, mode):
    res = train(load_config(None, FAST + [f"run.output_dir={tmp_path}", f"loop.mode={mode}"]))
    recs = [r for r in read_metrics(str(res.run_dir)) if r["kind"] == "train"]
    assert [r["step"] for r in recs] == [1, 2, 3, 4]
    failed = sum(r["rollout/failed_rollout"] for r in recs)
    assert failed > 0
    samples = sum(r["rollouts/count"] for r in recs)
    assert 0.1 < failed / samples < 0.6  # about the configured share
    for r in recs:  # a step without a failed sample has no failure keys (they read as 0)
        assert r.get("rollout/failed_score", 0) == 0
        assert r.get("rollout/failed_frac", 0) == pytest.approx(r["rollouts/failed"] / r["rollouts/count"])
    # the held-out eval is not wrapped: faults are for training rollouts only
    evals = [r for r in read_metrics(str(res.run_dir)) if r["kind"] == "eval"]
    assert evals and all("eval/rollout/failed_rollout" not in r and r["eval/rollouts/failed"] == 0 for r in evals)


def test_the_fault_rate_is_a_cli_override_and_bounded():
    r = subprocess.run([sys.executable, "-m", "posttrain.cli", "train", "--dry-run", "debug.rollout_fault_rate=0.1"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert yaml.safe_load(r.stdout)["debug"]["rollout_fault_rate"] == 0.1
    assert load_config(None, []).debug.rollout_fault_rate == 0.0  # off unless asked
    with pytest.raises(ConfigError):
        load_config(None, ["debug.rollout_fault_rate=1.5"])
