"""The Run watches itself: diagnostics land in metrics.jsonl and the summary; remedies reach the next steps."""

import json
from pathlib import Path

from posttrain.config import load_config
from posttrain.loop import train
from posttrain.obs import read_metrics

STALL = Path(__file__).resolve().parents[2] / "examples" / "stall_tasks.py"
FAST = ["model.name=tiny-random", "logging.tensorboard=false", "logging.console=false", "loop.eval_prompts=4",
        "loop.save_every=0", "task.env_check=off"]


def test_a_stalled_run_is_diagnosed_and_remedies_raise_exploration(tmp_path):
    # tiny-random never writes the label: every group is all-zero reward, "no learning signal" within 5 steps.
    res = train(load_config(None, FAST + [f"task.name={STALL}:partial_credit", "loop.steps=7",
                                          f"run.output_dir={tmp_path}", "diagnostics.remedies.enabled=true",
                                          "sampling.max_tokens=8"]))
    recs = read_metrics(str(res.run_dir))
    diag = [r for r in recs if r["kind"] == "diagnostic"]
    assert any(r["name"] == "no_signal" and r["step"] <= 5 for r in diag), diag
    remedies = [r for r in recs if r["kind"] == "remedy"]
    assert remedies, "remedies on: a stall must change exploration"
    train_recs = [r for r in recs if r["kind"] == "train"]
    # G doubled for the steps after the remedy: more rollouts per step than at the start
    assert train_recs[-1]["rollouts/count"] > train_recs[0]["rollouts/count"]
    summary = json.loads((res.run_dir / "summary.json").read_text())
    assert any(d["name"] == "no_signal" for d in summary["diagnostics"])


def test_remedies_switched_off_change_nothing(tmp_path):
    res = train(load_config(None, FAST + [f"task.name={STALL}:partial_credit", "loop.steps=6",
                                          f"run.output_dir={tmp_path}", "sampling.max_tokens=8",
                                          "diagnostics.remedies.enabled=false"]))
    recs = read_metrics(str(res.run_dir))
    assert any(r["kind"] == "diagnostic" for r in recs)
    assert not any(r["kind"] == "remedy" for r in recs)
    counts = {r["rollouts/count"] for r in recs if r["kind"] == "train"}
    assert len(counts) == 1  # nothing changed the sampling


def test_training_start_prints_preflight_verdicts_after_the_first_step(tmp_path, capsys):
    train(load_config(None, ["model.name=tiny-random", "task.name=count-a", "logging.tensorboard=false",
                             "loop.eval_prompts=4", "loop.save_every=0", "loop.steps=2", f"run.output_dir={tmp_path}"]))
    out = capsys.readouterr().out
    assert "preflight verdicts: count-a" in out
    assert out.index("step    1/2") < out.index("preflight verdicts") < out.index("step    2/2")
    assert "per training step on this machine" in out
