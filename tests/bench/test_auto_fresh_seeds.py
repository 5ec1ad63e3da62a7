"""bench/auto_fresh_seeds.py: re-runs a search's default and best configs on fresh seeds and says whether the
winner holds (more than either arm's seed spread), refusing the search's own seeds and stale run directories."""

import importlib.util
import json
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from posttrain.config.load import load_config, to_yaml

_spec = importlib.util.spec_from_file_location(
    "auto_fresh_seeds", Path(__file__).resolve().parents[2] / "bench" / "auto_fresh_seeds.py")
afs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(afs)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "auto"))
from auto_helpers import BASE, program_text  # noqa: E402

# A stand-in for `posttrain train CONFIG overrides...`: the metric is read from the config's trainer.lr.
FAKE = textwrap.dedent("""
    import json, sys, yaml
    from pathlib import Path
    cfg = yaml.safe_load(open(sys.argv[1]))
    args = dict(a.split("=", 1) for a in sys.argv[2:])
    run = Path(args["run.output_dir"]) / args["run.name"]
    run.mkdir(parents=True)
    lr, seed = float(cfg.get("trainer", {}).get("lr", 2e-5)), int(args["run.seed"])
    value = {2e-5: 0.40, 5e-5: 0.70}[lr] + 0.01 * seed
    (run / "summary.json").write_text(json.dumps({"after": {"eval/pass_rate": value}}))
""")


def search_dir(tmp_path, incumbent_trial=3, best_lr=5e-5):
    d = tmp_path / "search"
    d.mkdir()
    (d / "program.md").write_text(program_text(noise=0.05))
    (d / "base.yaml").write_text(yaml.safe_dump(BASE))
    (d / "best.yaml").write_text(yaml.safe_dump({**BASE, "trainer": {"lr": best_lr}}))
    (d / "search_state.json").write_text(json.dumps(
        {"incumbent": {"trial": incumbent_trial, "params": {"trainer.lr": best_lr}}}))
    return d


def test_a_winner_that_holds_and_the_files_it_writes(tmp_path, monkeypatch):
    fake = tmp_path / "fake_train.py"
    fake.write_text(FAKE)
    monkeypatch.setattr(afs, "TRAIN_COMMAND", [sys.executable, str(fake)])
    d = search_dir(tmp_path)
    assert afs.main([str(d), "--seeds", "2", "3", "--results", str(tmp_path / "res")]) == 0
    out = json.loads((tmp_path / "res/auto_fresh_seeds.json").read_text())
    assert out["arms"] == {"default": pytest.approx([0.42, 0.43]), "best": pytest.approx([0.72, 0.73])}
    assert out["holds"] and out["margin"] == pytest.approx(0.30) and out["noise"] == pytest.approx(0.05)
    assert "**holds**" in (tmp_path / "res/auto_fresh_seeds.md").read_text()
    assert (d / "fresh/best-s3/summary.json").exists()


def test_the_verdict_needs_more_than_either_arms_spread():
    v = afs.verdict({"default": [0.40, 0.60], "best": [0.70, 0.72]}, "max", 0.0)
    assert v["margin"] == pytest.approx(0.21) and v["noise"] == pytest.approx(0.20) and v["holds"]
    v = afs.verdict({"default": [0.50, 0.52], "best": [0.40, 0.90]}, "max", 0.0)  # best's own spread 0.5
    assert not v["holds"]
    v = afs.verdict({"default": [0.50, 0.52], "best": [0.55, 0.56]}, "max", 0.063)  # the floor
    assert not v["holds"] and v["noise"] == pytest.approx(0.063)
    v = afs.verdict({"default": [3.0, 3.1], "best": [2.0, 2.1]}, "min", 0.0)  # lower is better
    assert v["holds"] and v["margin"] == pytest.approx(1.0)


def test_refusals(tmp_path):
    d = search_dir(tmp_path, incumbent_trial=0)
    with pytest.raises(SystemExit, match="no candidate was accepted"):
        afs.main([str(d), "--results", str(tmp_path / "res")])
    with pytest.raises(SystemExit, match=r"seeds \[1\] are the search's own seeds"):
        afs.main([str(d), "--seeds", "1", "2"])


def test_a_finished_run_is_reused_only_with_the_same_config(tmp_path):
    d = search_dir(tmp_path)
    prog = afs.load_program(d / "program.md", d / "base.yaml")
    sp = afs.spec(prog, tmp_path / "fresh", "default", 2)
    ovs, run = sp.overrides, sp.run_dir
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(to_yaml(load_config(d / "base.yaml", ovs + ["run.seed=7"])))
    assert afs.same_config(run, d / "base.yaml", ovs)  # run.* aside
    assert not afs.same_config(run, d / "best.yaml", ovs)  # another learning rate
    (run / "summary.json").write_text("{}")
    with pytest.raises(SystemExit, match="different config"):
        afs.run_one(d / "best.yaml", sp, "eval/pass_rate")
