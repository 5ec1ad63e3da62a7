"""The command line, run as a user runs it (a subprocess), for the errors a user can make."""

import json
import subprocess
import sys

import yaml


def run_cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "posttrain.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


def test_dry_run_prints_resolved_config():
    r = run_cli("train", "--dry-run", "trainer.lr=3e-5", "loop.steps=2")
    assert r.returncode == 0, r.stderr
    cfg = yaml.safe_load(r.stdout)
    assert cfg["trainer"]["lr"] == 3e-5 and cfg["loop"]["steps"] == 2 and cfg["model"]["name"] == "default"


def test_dry_run_with_config_file(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("loop:\n  steps: 11\n")
    r = run_cli("train", str(p), "--dry-run")
    assert r.returncode == 0 and yaml.safe_load(r.stdout)["loop"]["steps"] == 11


def test_unknown_key_exits_2_with_hint():
    r = run_cli("train", "--dry-run", "trainer.lrr=1")
    assert r.returncode == 2 and "did you mean 'trainer.lr'" in r.stderr


def test_wrong_type_and_missing_file():
    r = run_cli("train", "--dry-run", "loop.steps=many")
    assert r.returncode == 2 and "'loop.steps' = 'many'" in r.stderr
    r = run_cli("train", "does/not/exist.yaml")
    assert r.returncode == 2 and "config file not found" in r.stderr


def test_bad_task_paths(tmp_path):
    r = run_cli("train", "task.name=nope.py:make_task", "model.name=tiny-random", f"run.output_dir={tmp_path}")
    assert r.returncode == 2 and "task file not found" in r.stderr
    r = run_cli("train", "task.name=no-such-task", "model.name=tiny-random", f"run.output_dir={tmp_path}")
    assert r.returncode == 2 and "unknown task 'no-such-task'" in r.stderr
    f = tmp_path / "t.py"
    f.write_text("x = 1\n")
    r = run_cli("train", f"task.name={f}:make_task", "model.name=tiny-random", f"run.output_dir={tmp_path}")
    assert r.returncode == 2 and "has no function 'make_task'" in r.stderr


def test_bad_model_path(tmp_path):
    r = run_cli("train", "model.name=./no/such/model", "task.name=count-a", f"run.output_dir={tmp_path}")
    assert r.returncode == 2 and "model folder not found" in r.stderr


def test_train_report_and_eval_end_to_end(tmp_path):
    r = run_cli("train", "model.name=tiny-random", "task.name=count-a", "loop.steps=2", "loop.eval_prompts=4",
                f"run.output_dir={tmp_path}", "run.name=r", "logging.tensorboard=false")
    assert r.returncode == 0, r.stderr
    assert "before" in r.stdout and "after" in r.stdout and "step    2/2" in r.stdout
    run = tmp_path / "r"
    summary = json.loads((run / "summary.json").read_text())
    assert "eval/pass_rate" in summary["after"]
    r = run_cli("report", str(run))
    assert r.returncode == 0, r.stderr
    assert (run / "report.html").stat().st_size > 100_000  # plotly inlined (tests/obs/test_html_report.py)
    r = run_cli("report", str(run), "--out", str(run / "report.png"))
    assert r.returncode == 0, r.stderr
    assert (run / "report.png").stat().st_size > 1000
    r = run_cli("eval", "--model", str(run / "final"), "--task", "count-a", "--prompts", "4")
    assert r.returncode == 0, r.stderr
    assert "pass_rate" in r.stdout
    r = run_cli("eval", "--model", str(run / "final"), "--task", "count-a", "--prompts", "2", "--samples", "3",
                "--temperature", "1.0")
    assert r.returncode == 0, r.stderr
    assert "pass_at_n" in r.stdout
    r = run_cli("eval", "--model", str(run / "final"), "--task", "count-a", "--samples", "3")  # greedy: refused
    assert r.returncode != 0 and "eval_temperature" in r.stderr
    r = run_cli("train", "--resume", str(run), "loop.steps=3", "logging.tensorboard=false")
    assert r.returncode == 0, r.stderr
    assert "resumed from" in r.stdout and "step    3/3" in r.stdout


def test_eval_takes_task_options():
    # a task option reaches the task (a bad one is the task's own error), and a malformed one is refused
    r = run_cli("eval", "--model", "tiny-random", "--task", "reversal", "--prompts", "1", "--max-tokens", "2",
                "-o", "size=3", "-o", "rho=1.0", "-o", "max_turns=2")
    assert r.returncode == 0, r.stderr
    assert "pass_rate" in r.stdout
    r = run_cli("eval", "--model", "tiny-random", "--task", "reversal", "-o", "rho=7")
    assert r.returncode != 0 and "rho must be in [0, 1]" in r.stderr
    r = run_cli("eval", "--model", "tiny-random", "--task", "reversal", "-o", "rho")
    assert r.returncode != 0 and "--option takes KEY=VALUE" in r.stderr


def test_resume_errors(tmp_path):
    r = run_cli("train", "--resume", str(tmp_path / "missing"))
    assert r.returncode == 2 and "not found" in r.stderr


def test_unknown_algorithm_name_fails_fast_with_hint(tmp_path):
    r = run_cli("train", "algorithm.loss=ppo_clp", "model.name=tiny-random", "task.name=count-a",
                f"run.output_dir={tmp_path}")
    assert r.returncode == 2 and "unknown policy loss 'ppo_clp'; did you mean 'ppo_clip'" in r.stderr
    assert not any(tmp_path.iterdir())  # no half-made run directory left behind
