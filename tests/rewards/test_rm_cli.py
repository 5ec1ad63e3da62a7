"""`posttrain rm train` and the two reward tasks from the command line."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from posttrain.cli import app

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ["model.name=tiny-random", "loop.steps=2", "loop.eval_prompts=2", "logging.tensorboard=false",
         "loop.save_every=0", "model.threads=1"]


def test_rm_train_with_missing_data_is_a_clear_error(tmp_path):
    r = CliRunner().invoke(app, ["rm", "train", "--data", str(tmp_path / "nope.jsonl"), "--model", "tiny-random"])
    assert r.exit_code == 2 and "preference data not found" in r.output


def test_train_with_a_missing_reward_model_is_a_clear_error(tmp_path):
    r = CliRunner().invoke(app, ["train", "task.name=product-blurb", f"task.options.rm={tmp_path / 'no-rm'}",
                                 "model.name=tiny-random"])
    assert r.exit_code == 2 and "reward model folder not found" in r.output


def _cli(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "posttrain.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.slow  # two subprocesses with model loads: about 1.5 min on the shared 2-core machine
def test_rm_train_then_product_blurb_trains_on_it(tmp_path):
    r = _cli("rm", "train", "--model", "tiny-random", "--max-train-pairs", "32", "--max-eval-pairs", "16",
             "--threads", "1", "--out", str(tmp_path / "rm"))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "held-out pair accuracy" in r.stdout and (tmp_path / "rm" / "config.json").exists()
    r = _cli("train", "task.name=product-blurb", f"task.options.rm={tmp_path / 'rm'}", *SMOKE,
             f"run.output_dir={tmp_path / 'runs'}")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "pass/hidden_rule" in r.stdout


@pytest.mark.slow  # sentence-transformers' import alone takes 10-40 s here
@pytest.mark.skipif(importlib.util.find_spec("sentence_transformers") is None, reason="needs posttrain[embed]")
def test_listing_summary_runs_two_steps(tmp_path):
    r = _cli("train", "task.name=listing-summary", *SMOKE, f"run.output_dir={tmp_path}")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "pass/embedding_margin" in r.stdout


def test_env_check_names_the_missing_reward_model(tmp_path, monkeypatch):
    monkeypatch.setenv("POSTTRAIN_CACHE", str(tmp_path))  # no reward model in the default folder
    r = CliRunner().invoke(app, ["env", "check", "--task", "product-blurb"])
    assert r.exit_code == 2 and "reward_models/product-blurb" in r.output and "posttrain rm train" in r.output


def test_a_bad_config_reward_is_a_clear_error():
    r = CliRunner().invoke(app, ["train", "task.name=count-a", "model.name=tiny-random", "task.rewards=[{fn: nope}]"])
    assert r.exit_code == 2 and "task.rewards[0].fn: 'nope' is not a reward" in r.output
