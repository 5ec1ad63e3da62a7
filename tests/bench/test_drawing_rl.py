"""bench/drawing_rl.py: the drawing RL table (warm start -> last eval, per seed and arm) from finished run dirs."""

import importlib.util
import json
from pathlib import Path

import pytest
import yaml

_spec = importlib.util.spec_from_file_location(
    "drawing_rl", Path(__file__).resolve().parents[2] / "bench" / "drawing_rl.py")
drl = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(drl)


def _run(root: Path, name: str, seed: int, gated: list[float]) -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "config.yaml").write_text(yaml.safe_dump({"run": {"seed": seed}, "trainer": {"lr": 5e-6},
                                                   "algorithm": {"beta": 0.05}}))
    recs = [{"kind": "warm_start", "step": 1}]
    for i, g in enumerate(gated):
        step = 10 * i
        if step:
            recs.append({"kind": "train", "step": step})
        recs.append({"kind": "eval", "step": step, "eval/reward/mean": g, "eval/reward/drawing_image": g / 2,
                     "eval/drawing/gate_pass_rate": 1.0, "eval/pass_rate": 0.0})
    (d / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    return d


def test_the_table_reads_each_runs_change_from_the_warm_start(tmp_path, capsys):
    runs = [_run(tmp_path, "kl-s0", 0, [0.20, 0.25, 0.30]), _run(tmp_path, "kl-s1", 1, [0.30, 0.10]),
            _run(tmp_path, "plain-s0", 0, [0.2, 0.1])]
    drl.main([str(r) for r in runs] + ["--out", str(tmp_path / "out" / "t")])
    out = capsys.readouterr().out
    assert "| kl | s0: 0.200 -> 0.300, s1: 0.300 -> 0.100 | -0.050 (-0.200..+0.100) | 1 of 2 |" in out
    assert "| plain | s0: 0.200 -> 0.100 | -0.100 (-0.100..-0.100) | 0 of 1 |" in out
    assert "| kl-s0 | 0 | 20 | 0.300 | 0.150 | 1.000 | 0.000 |" in out
    saved = json.loads((tmp_path / "out" / "t.json").read_text())
    assert [r["steps"] for r in saved] == [20, 10, 10]
    assert (tmp_path / "out" / "t.md").read_text().startswith("# bench/drawing_rl.py")


def test_bad_run_dirs_are_refused(tmp_path):
    with pytest.raises(SystemExit, match="no metrics.jsonl"):
        drl.main([str(tmp_path / "nope")])
    d = tmp_path / "warming"
    d.mkdir()
    (d / "config.yaml").write_text("run: {seed: 0}\n")
    (d / "metrics.jsonl").write_text(json.dumps({"kind": "warm_start", "step": 1}) + "\n")
    with pytest.raises(SystemExit, match="no held-out eval"):
        drl.main([str(d), "--out", str(tmp_path / "o")])
