"""bench/fault_injection.py reads a run's metrics.jsonl into its table: failures counted per step, absent keys 0,
rows of other tasks kept."""

import importlib.util
import json
import sys
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "fault_bench", Path(__file__).resolve().parents[2] / "bench" / "fault_injection.py")
fb = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fb)


def test_summary_counts_failures_and_keeps_other_rows(tmp_path, monkeypatch):
    run_dir = tmp_path / "runs" / "coding-agent"
    run_dir.mkdir(parents=True)
    recs = [{"kind": "train", "step": 1, "rollouts/count": 4.0, "time/step": 60.0},  # no failure: keys absent
            {"kind": "eval", "step": 1, "eval/pass_rate": 0.0},
            {"kind": "train", "step": 2, "rollouts/count": 4.0, "time/step": 30.0, "rollout/failed_rollout": 1.0,
             "rollout/failed_score": 0.0, "rollout/failed_frac": 0.25}]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    results = tmp_path / "results"
    results.mkdir()
    (results / "fault_injection.json").write_text(json.dumps([{"task": "feature-deletion", "steps_finished": 10,
        "steps_wanted": 10, "samples": 80, "failed_rollout": 9, "failed_score": 0, "failed_frac_per_step": [0.1],
        "exit_code": 0, "minutes": 7.7, "step_minutes": 6.7, "command": "x"}]))
    monkeypatch.setattr(fb, "RESULTS", results)
    monkeypatch.setattr(sys, "argv", ["fault_injection.py", "--only", "coding-agent", "--summarize-only",
                                      "--out", str(tmp_path / "runs")])
    fb.main()
    rows = json.loads((results / "fault_injection.json").read_text())
    assert [r["task"] for r in rows] == ["feature-deletion", "coding-agent"]
    ca = rows[1]
    assert (ca["steps_finished"], ca["samples"], ca["failed_rollout"], ca["failed_frac_per_step"]) == (2, 8, 1, [0.0, 0.25])
    assert ca["step_minutes"] == 1.5 and ca["exit_code"] is None  # not run here: no exit code is made up
    assert "| coding-agent | 2 / 4 | 8 | 1 | 0 |" in (results / "fault_injection.md").read_text()
