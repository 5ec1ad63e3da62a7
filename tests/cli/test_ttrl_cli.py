"""`posttrain ttrl`: parses into `posttrain train` with the ttrl task, rejects bad input with clear errors, and runs
end to end on the tiny random model, reporting pass@1 and maj@n before and after."""

import yaml
from typer.testing import CliRunner

from posttrain.cli import app

runner = CliRunner()


def _out(r):
    return r.output + (getattr(r, "stderr", "") if r.stderr_bytes is not None else "")


def test_dry_run_wraps_the_task_and_sets_maj_at_n_eval():
    r = runner.invoke(app, ["ttrl", "--task", "arith", "--dry-run", "loop.steps=3", "task.options.n_train=8"])
    assert r.exit_code == 0, _out(r)
    cfg = yaml.safe_load(r.stdout)
    assert cfg["task"]["name"] == "ttrl" and cfg["task"]["options"] == {"base": "arith", "mode": "majority",
                                                                         "n_train": 8}
    assert cfg["loop"]["eval_samples"] == 4 and cfg["sampling"]["eval_temperature"] == 0.7
    assert cfg["loop"]["steps"] == 3
    r = runner.invoke(app, ["ttrl", "--task", "count-a", "--mode", "discover", "--state", "b.json", "--dry-run"])
    cfg = yaml.safe_load(r.stdout)
    assert cfg["task"]["options"]["state_file"] == "b.json" and cfg["loop"]["eval_samples"] == 1


def test_bad_input_is_rejected_clearly():
    cases = [(["ttrl"], "--task"),
             (["ttrl", "--task", "arith", "--mode", "vote"], "--mode must be 'majority' or 'discover'"),
             (["ttrl", "--task", "arith", "config.yaml"], "ttrl takes overrides like loop.steps=20"),
             (["ttrl", "--task", "arith", "task.name=count-a"], "task.name is set by ttrl"),
             (["ttrl", "--task", "arith", "--state", "s.json"], "--state is for --mode discover"),
             (["ttrl", "--task", "arith", "--eval-samples", "0"], "--eval-samples must be >= 1"),
             (["ttrl", "--task", "arith", "trainer.lrr=1", "--dry-run"], "lrr")]
    for args, msg in cases:
        r = runner.invoke(app, args)
        assert r.exit_code == 2, (args, _out(r))
        assert msg in _out(r), (args, _out(r))


def test_end_to_end_on_tiny_random(tmp_path):
    r = runner.invoke(app, ["ttrl", "--task", "arith", "model.name=tiny-random", "loop.steps=1", "model.threads=1",
                            "loop.prompts_per_step=2", "algorithm.num_generations=4", "loop.eval_prompts=2",
                            "sampling.max_tokens=4", f"run.output_dir={tmp_path}", "logging.console=false",
                            "task.options.n_train=4", "task.options.n_eval=2"])
    assert r.exit_code == 0, _out(r)
    assert "pass@1 (labels, eval only):" in r.stdout and "maj@4 (majority right):" in r.stdout


def test_label_free_training_records_no_pass_and_is_not_called_a_stall(tmp_path):
    """The training rows have no labels, so their "pass" would always be 0% and read as a plateau without a pass
    (a 30-step arith run was flagged from step 5). Train records leave the pass out; the eval keeps its own."""
    import json

    r = runner.invoke(app, ["ttrl", "--task", "arith", "model.name=tiny-random", "loop.steps=6", "model.threads=1",
                            "loop.prompts_per_step=2", "algorithm.num_generations=4", "loop.eval_prompts=2",
                            "sampling.max_tokens=4", f"run.output_dir={tmp_path}", "logging.console=false",
                            "task.options.n_train=4", "task.options.n_eval=2", "diagnostics.plateau_window=2",
                            "diagnostics.remedies.enabled=true"])
    assert r.exit_code == 0, _out(r)
    recs = [json.loads(x) for f in tmp_path.glob("*/metrics.jsonl") for x in f.read_text().splitlines()]
    train = [x for x in recs if x.get("kind") == "train"]
    assert len(train) == 6 and not any(k.startswith(("pass_rate", "pass/")) for x in train for k in x)
    assert any("eval/pass_rate" in x for x in recs if x.get("kind") == "eval")
    names = {x.get("name") for x in recs if x.get("kind") == "diagnostic"}
    assert "plateau_no_pass" not in names and not any(x.get("kind") == "remedy" for x in recs)
