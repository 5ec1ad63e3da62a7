"""`posttrain auto` with real `posttrain train` subprocesses: tiny-random on count-a, 2 steps a trial."""

import json
import subprocess
import sys

import pytest
import yaml

from posttrain.auto.search import read_results


@pytest.mark.slow
def test_real_search_on_tiny_random(tmp_path):
    pytest.importorskip("optuna")
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump({"model": {"name": "tiny-random", "threads": 1}, "task": {"name": "count-a"},
                                    "loop": {"eval_prompts": 4, "prompts_per_step": 2, "eval_before": False,
                                             "save_every": 0, "samples_per_step": 0},
                                    "algorithm": {"num_generations": 2}, "logging": {"tensorboard": False}}))
    prog = tmp_path / "program.md"
    prog.write_text("# tiny\n\n```yaml\n" + yaml.safe_dump({
        "goal": "smoke", "metric": "eval/reward/mean", "direction": "max",
        "budget": {"trial": {"steps": 2, "timeout_s": 240}, "total": {"trials": 1}},
        "search": {"trainer.lr": {"low": 1e-4, "high": 1e-2, "log": True}},
        "frozen": ["model.name"], "set": {"loop.eval_every": 1}}) + "```\n")
    r = subprocess.run([sys.executable, "-m", "posttrain.cli", "auto", str(prog), str(base), "--out",
                        str(tmp_path / "s")], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    rows = read_results(tmp_path / "s")
    assert [r["trial"] for r in rows] == ["0", "1"] and rows[0]["decision"] == "baseline"
    assert rows[1]["status"] in ("ok", "pruned")
    assert len(json.loads(rows[0]["values"])) == 2
    summary = json.loads((tmp_path / "s/trials/trial-000-s0/summary.json").read_text())
    assert summary["steps"] == 2
    assert (tmp_path / "s/report.html").exists() and (tmp_path / "s/best.yaml").exists()
