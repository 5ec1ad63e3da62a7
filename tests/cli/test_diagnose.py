"""`posttrain diagnose RUN_DIR`, run as a user runs it, on a real tiny-random run and on crafted run dirs."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "obs"))
from diag_streams import STALL_AT, _no_signal, stream  # noqa: E402

from posttrain.config.schema import DiagnosticsConfig  # noqa: E402
from posttrain.obs.diagnostics import Diagnostics  # noqa: E402


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "posttrain.cli", "diagnose", *map(str, args)],
                          capture_output=True, text=True, timeout=300)


def write_run(path: Path, records, config_yaml: str | None = None) -> Path:
    path.mkdir(parents=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if config_yaml is not None:
        (path / "config.yaml").write_text(config_yaml)
    return path


def test_real_tiny_run_with_the_truncation_stall_task(tmp_path):
    """A real 4-step run of the `truncated` stall task: a random model never stops before the token limit and
    rarely earns any reward, so diagnose must report truncation from the third step (patience 3)."""
    from posttrain.config import load_config
    from posttrain.loop import train

    cfg = load_config(None, ["model.name=tiny-random", f"task.name={ROOT}/examples/stall_tasks.py:truncated",
                             "task.env_check=off", "logging.tensorboard=false", "logging.console=false",
                             "loop.eval_prompts=4", "loop.steps=4", "loop.save_every=0", "loop.prompts_per_step=2",
                             "sampling.max_tokens=8", f"run.output_dir={tmp_path}"])
    res = train(cfg)
    r = run_cli(res.run_dir, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    names = {d["name"] for d in out["diagnostics"]}
    assert out["train_steps"] == 4 and not out["healthy"]
    assert "truncation" in names
    first = {d["name"]: d["start_step"] for d in out["diagnostics"]}
    assert first["truncation"] == 3, "patience 3: fires on the third truncated step"
    r = run_cli(res.run_dir)
    assert r.returncode == 0 and "truncation" in r.stdout and "sampling.max_tokens" in r.stdout


def test_stalled_run_dir_prints_verdict_and_advice(tmp_path):
    run = write_run(tmp_path / "stalled", stream(bad=_no_signal))
    r = run_cli(run)
    assert r.returncode == 0, r.stderr
    assert "no_signal" in r.stdout and "no learning signal" in r.stdout and "active" in r.stdout
    start = Diagnostics().replay(stream(bad=_no_signal))[0].step
    assert STALL_AT <= start <= STALL_AT + 5 and f"[no_signal] since step {start}, active" in r.stdout


def test_healthy_run_dir(tmp_path):
    run = write_run(tmp_path / "ok", stream(n=40))
    r = run_cli(run)
    assert r.returncode == 0 and "healthy, no diagnostic fired" in r.stdout


def test_running_run_with_a_half_written_line_and_its_own_thresholds(tmp_path):
    run = write_run(tmp_path / "live", stream(bad=_no_signal), "diagnostics:\n  patience: 6\n")
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"kind": "train", "step": 31, "rew')  # the loop is mid-write
    out = json.loads(run_cli(run, "--json").stdout)
    default = Diagnostics().replay(stream(bad=_no_signal))[0].step
    patient = Diagnostics(DiagnosticsConfig(patience=6)).replay(stream(bad=_no_signal))[0].step
    assert out["diagnostics"][0]["start_step"] == patient > default, "the run's config.yaml thresholds are used"


@pytest.mark.parametrize("case", ["missing_dir", "no_metrics", "bad_config"])
def test_errors_exit_2(tmp_path, case):
    target = tmp_path / "nope"
    if case != "missing_dir":
        target.mkdir()
    if case == "bad_config":
        (target / "metrics.jsonl").write_text("")
        (target / "config.yaml").write_text("diagnostics:\n  patience: many\n")
    r = run_cli(target)
    assert r.returncode == 2 and "error:" in r.stderr
