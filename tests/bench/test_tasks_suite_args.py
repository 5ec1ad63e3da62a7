"""bench/tasks_suite.py: its arguments reach the posttrain config (the default config but for the task, steps, seed,
held-out prompts, max tokens and eval cadence), and its table reads fake records right (before/after spread, time
to TRL's final level, the per-step ratio, what --resume skips)."""

import importlib.util
import sys
from pathlib import Path

import pytest

from posttrain.config import load_config

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))  # tasks_suite imports its siblings (rg_survey, vs_trl)
_spec = importlib.util.spec_from_file_location("tasks_suite", BENCH / "tasks_suite.py")
ts = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ts)


def _record(fw, dataset, seed, passes, step_s=1.0, every=5):
    """A fake run: held-out pass at steps 0, every, 2*every, ...; each step takes step_s seconds."""
    steps = [{"step": i + 1, "seconds": step_s, "reward": 0.0} for i in range(every * (len(passes) - 1))]
    return {"framework": fw, "dataset": dataset, "seed": seed, "steps": steps,
            "evals": [{"step": i * every, "pass": p} for i, p in enumerate(passes)]}


def test_defaults_are_eight_surveyed_datasets_three_seeds_and_three_trl_datasets():
    a = ts.parse_args([])
    assert len(a.datasets) == 8 and a.seeds == [0, 1, 2] and a.steps == 30
    assert len(a.trl_datasets) == 3 and set(a.trl_datasets) <= set(a.datasets)
    assert a.eval_every == 5 and not a.resume and a.only is None


def test_unknown_dataset_is_refused():
    with pytest.raises(SystemExit):
        ts.parse_args(["--datasets", "no_such_dataset"])


def test_posttrain_run_is_the_default_config_but_for_what_the_bench_sets():
    a = ts.parse_args(["--only", "posttrain", "--dataset", "basic_arithmetic", "--seed", "2", "--max-tokens", "48",
                       "--eval-prompts", "16", "--steps", "7"])
    cfg = load_config(None, ts.posttrain_overrides(a, "/tmp/x"))
    default = load_config(None, [])
    assert cfg.task.name == "reasoning_gym:basic_arithmetic"
    assert cfg.task.options["operators"] == ["+", "-"] and cfg.task.options["train_size"] == ts.TRAIN_SIZE
    assert cfg.task.options["eval_size"] == 16 and cfg.loop.eval_prompts == 16
    assert (cfg.run.seed, cfg.loop.steps, cfg.sampling.max_tokens, cfg.loop.eval_every) == (2, 7, 48, 5)
    assert cfg.trainer.lr == default.trainer.lr and cfg.sampling.temperature == default.sampling.temperature
    assert cfg.algorithm == default.algorithm and cfg.loop.prompts_per_step == default.loop.prompts_per_step


def test_run_order_and_resume_skip():
    a = ts.parse_args(["--datasets", "gcd", "lcm", "--trl-datasets", "gcd", "--seeds", "0", "1"])
    assert ts.planned(a) == [("posttrain", "gcd", 0), ("posttrain", "lcm", 0), ("trl", "gcd", 0),
                             ("posttrain", "gcd", 1), ("posttrain", "lcm", 1), ("trl", "gcd", 1)]
    done = ts.done_keys({"runs": [_record("posttrain", "gcd", 0, [0.1, 0.2])]})
    assert done == {("posttrain", "gcd", 0)}
    argv = ts.child_argv(a, "trl", "gcd", 1, "/tmp/o.json")
    assert ts.parse_args(argv[2:]).only == "trl" and ts.parse_args(argv[2:]).seed == 1


def test_time_to_level_counts_training_seconds_until_the_first_eval_at_the_level():
    r = _record("posttrain", "gcd", 0, [0.1, 0.3, 0.5, 0.4], step_s=2.0)
    assert ts.time_to_level(r, 0.1) == 0.0  # the base model is already there
    assert ts.time_to_level(r, 0.45) == 20.0  # step 10's eval: 10 steps of 2 s
    assert ts.time_to_level(r, 0.6) is None
    assert ts.steps_to_level(r, 0.1) == 0 and ts.steps_to_level(r, 0.45) == 10 and ts.steps_to_level(r, 0.6) is None


def test_table_rows_spread_gain_level_and_step_ratio():
    runs = [_record("posttrain", "gcd", 0, [0.2, 0.4, 0.6], step_s=1.0),
            _record("posttrain", "gcd", 1, [0.2, 0.2, 0.4], step_s=1.0),
            _record("trl", "gcd", 0, [0.2, 0.3, 0.5], step_s=2.0),
            _record("posttrain", "lcm", 0, [0.1, 0.1, 0.1])]
    assert ts.trl_levels(runs) == {"gcd": 0.5}
    rows = {(r["dataset"], r["framework"]): r for r in ts.table_rows(runs)}
    pt = rows[("gcd", "posttrain")]
    assert pt["seeds"] == [0, 1] and pt["before"] == (0.2, 0.0)
    assert pt["after"][0] == pytest.approx(0.5) and pt["after"][1] == pytest.approx(0.1414, abs=1e-3)
    assert pt["gain"] == pytest.approx(0.3)
    assert pt["to_trl_level_s"] == 10.0 and pt["reached"] == "1/2"  # seed 1 never gets to 0.5
    assert rows[("gcd", "trl")]["to_trl_level_s"] == 20.0 and rows[("gcd", "trl")]["wall_s"] == 20.0
    assert rows[("lcm", "posttrain")]["reached"] == ""  # no TRL run on lcm: no level to reach
    assert ts.step_ratios(list(rows.values())) == {"gcd": 0.5}
    md = ts.markdown(ts.table_rows(runs))
    assert "| gcd | posttrain | 0,1 | 20.0% ± 0.0% | 50.0% ± 14.1% | +30.0% |" in md
    assert "10 s, 10 steps (1/2)" in md and "posttrain/TRL wall seconds per step: gcd 0.50" in md
