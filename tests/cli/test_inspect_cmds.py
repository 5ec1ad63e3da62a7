"""`posttrain eval` (cli/inspect_cmds.py) refuses what it cannot bound, before a model is loaded: a sample count
past the cap, a temperature that is not a finite number. Run as a user runs it (a subprocess)."""

import subprocess
import sys

import pytest


def run_cli(*args, timeout=120):
    # 120 s: a refusal takes the import time (~10 s); the unbounded eval this guards against ran for minutes
    return subprocess.run([sys.executable, "-m", "posttrain.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def _refused(r, *words):
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    lines = [ln for ln in r.stderr.splitlines() if all(w in ln for w in words)]
    assert len(lines) == 1, r.stderr[-2000:]  # one line says what and why


def test_eval_refuses_a_million_samples_per_prompt():
    r = run_cli("eval", "--model", "tiny-random", "--task", "count-a", "--prompts", "1", "--max-tokens", "2",
                "--temperature", "0.7", "--samples", "1000000")
    _refused(r, "loop.eval_samples", "1024")


@pytest.mark.parametrize("value", ["inf", "nan", "-inf"])
def test_eval_refuses_a_temperature_that_is_not_finite(value):
    r = run_cli("eval", "--model", "tiny-random", "--task", "count-a", "--prompts", "1", "--max-tokens", "2",
                "--temperature", value)
    _refused(r, "sampling.eval_temperature")


def test_a_config_with_an_infinite_temperature_is_refused(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("sampling:\n  temperature: .inf\n")
    _refused(run_cli("train", str(p), "--dry-run"), "sampling.temperature", "finite")
    _refused(run_cli("train", "--dry-run", "sampling.temperature=nan"), "sampling.temperature", "finite")
