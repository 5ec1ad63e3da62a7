"""Eval suites (loop/eval_suite.py, algos/pass_at_k.py): pass@1, pass@k and maj@k per task, against a hand
computation; `posttrain eval` with three tasks and k=8."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from posttrain.algos.pass_at_k import majority_correct, pass_at_k, prompt_metrics
from posttrain.envs.task import Task
from posttrain.loop.eval_suite import SuiteSettings, SuiteTask, run_suite
from posttrain.rewards.rubric import RewardComponent, Rubric
from posttrain.sampling.scripted import ScriptedSampler


@given(st.integers(1, 40).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_pass_at_k_is_the_combinatorial_formula(nck):
    n, c, k = nck
    exact = 1 - math.comb(n - c, k) / math.comb(n, k)
    assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12)


def test_pass_at_k_edges_and_bad_input():
    assert pass_at_k(8, 0, 8) == 0.0 and pass_at_k(8, 1, 8) == 1.0 and pass_at_k(8, 8, 1) == 1.0
    assert pass_at_k(8, 2, 1) == pytest.approx(0.25)
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)


def test_majority_vote():
    assert majority_correct(["7", "7", "3"], [True, True, False])
    assert not majority_correct(["3", "7", "3"], [False, True, False])
    assert majority_correct(["7", "3"], [True, False])  # a tie goes to the first seen
    assert not majority_correct([None, None], [False, False])
    assert majority_correct([None, "7", None], [False, True, False])  # no answer is no vote


def _task(name: str, answer: str, n_rows: int = 2) -> Task:
    def right(completions, **_):
        return [1.0 if answer in c else 0.0 for c in completions]

    rows = [{"prompt": f"{name} question {i}"} for i in range(n_rows)]
    return Task(name, rows, rows, Rubric([RewardComponent("right", right)]), max_tokens=8)


def test_a_three_task_suite_with_k8_matches_a_hand_computation(tiny):
    """Scripted replies cycle in a known order, so each prompt's 8 samples are known: the metrics follow by hand."""
    _, tok = tiny
    # Replies are handed out in call order: task a's 2 prompts x 8 samples take replies 0..15, then b's, then c's.
    a = ["<answer>7</answer>"] * 3 + ["<answer>5</answer>"] * 5 + ["<answer>7</answer>"] * 6 + ["none"] * 2
    b = ["<answer>1</answer>"] * 8 + ["<answer>2</answer>"] * 8
    c = ["<answer>x</answer>", "<answer>y</answer>"] * 8
    sampler = ScriptedSampler(tok, a + b + c)
    suite = [SuiteTask(_task("a", "7"), prompts=2), SuiteTask(_task("b", "2"), prompts=2),
             SuiteTask(_task("c", "x"), prompts=2)]
    res = run_suite(suite, sampler, tok, SuiteSettings(samples=8, temperature=1.0))
    by = {t.name: t.metrics for t in res.tasks}
    # a: prompt 0 has 3 of 8 passing (majority "5": wrong); prompt 1 has 6 of 8 (majority "7": right)
    assert by["a"]["pass@1"] == pytest.approx((3 / 8 + 6 / 8) / 2)
    assert by["a"]["pass@8"] == 1.0 and by["a"]["maj@8"] == 0.5
    # b: prompt 0 never passes, prompt 1 always does
    assert by["b"]["pass@1"] == 0.5 and by["b"]["pass@8"] == 0.5 and by["b"]["maj@8"] == 0.5
    # c: 4 of 8 per prompt, a tie in the vote goes to the first answer seen ("x": right)
    assert by["c"]["pass@1"] == 0.5 and by["c"]["pass@8"] == 1.0 and by["c"]["maj@8"] == 1.0
    flat = res.flat_metrics()
    assert flat["suite/a/maj@8"] == 0.5 and flat["suite/c/pass@1"] == 0.5
    assert [r["task"] for r in res.table()] == ["a", "b", "c"]
    assert json.loads(json.dumps(res.to_json()))["samples"] == 8


def test_prompt_metrics_for_k_below_n():
    m = prompt_metrics([True, False, False, False], 2)
    assert m["pass@1"] == 0.25 and m["pass@2"] == pytest.approx(1 - math.comb(3, 2) / math.comb(4, 2))


def test_posttrain_eval_runs_a_three_task_suite_and_writes_json(tmp_path):
    out = tmp_path / "suite.json"
    r = subprocess.run([sys.executable, "-m", "posttrain.cli", "eval", "--model", "tiny-random", "--task", "count-a",
                        "--task", "json-extract", "--task", "reversal", "--prompts", "2", "--samples", "8",
                        "--temperature", "1.0", "--max-tokens", "4", "-o", "reversal:size=3", "--json", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "pass@8" in r.stdout and "maj@8" in r.stdout
    data = json.loads(out.read_text())
    assert [t["task"] for t in data["tasks"]] == ["count-a", "json-extract", "reversal"]
    for t in data["tasks"]:
        assert 0.0 <= t["metrics"]["pass@1"] <= t["metrics"]["pass@8"] <= 1.0
    r = subprocess.run([sys.executable, "-m", "posttrain.cli", "eval", "--model", "tiny-random", "--task", "count-a",
                        "--task", "count-a", "--samples", "8"], capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "eval_temperature" in r.stderr  # k samples of a greedy eval: refused


def test_a_run_evaluates_its_suite_before_during_and_after_training(tmp_path):
    from posttrain.config import load_config
    from posttrain.loop import train

    cfg = load_config(None, ["model.name=tiny-random", "task.name=count-a", "logging.tensorboard=false",
                             "logging.console=false", "loop.eval_prompts=2", "loop.steps=2", "loop.save_every=0",
                             "eval_suite.tasks=[{name: count-a}, {name: arith}]", "eval_suite.every=1",
                             "eval_suite.samples=4", "eval_suite.prompts=2", f"run.output_dir={tmp_path}"])
    res = train(cfg)
    recs = [json.loads(line) for line in (res.run_dir / "metrics.jsonl").read_text().splitlines()]
    suite = [r for r in recs if r.get("kind") == "suite"]
    assert [r["step"] for r in suite] == [0, 1, 2]  # the base model, every step, the end
    for r in suite:
        for task in ("count-a", "arith"):
            assert 0.0 <= r[f"suite/{task}/pass@1"] <= r[f"suite/{task}/pass@4"] <= 1.0
            assert f"suite/{task}/maj@4" in r
    summary = json.loads((res.run_dir / "summary.json").read_text())
    assert set(summary["suite"]) == {"before", "after"} and summary["suite"]["after"] == {
        k: v for k, v in suite[-1].items() if k.startswith("suite/")}


def test_posttrain_eval_takes_a_task_from_data_first_in_a_suite(tmp_path):
    data = tmp_path / "sums.jsonl"
    data.write_text("".join(json.dumps({"question": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(20)))
    out = tmp_path / "suite.json"
    r = subprocess.run([sys.executable, "-m", "posttrain.cli", "eval", "--model", "tiny-random", "--task", "count-a",
                        "--set", f"task.dataset={data}", "--set", "task.rewards=[{fn: math}]",
                        "--set", "task.prompt_column=question", "--prompts", "2", "--samples", "2",
                        "--temperature", "1.0", "--max-tokens", "4", "--json", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert [t["task"] for t in json.loads(out.read_text())["tasks"]] == ["dataset:sums", "count-a"]


def test_suite_settings_refuse_too_many_samples_and_a_temperature_that_is_not_finite():
    with pytest.raises(ValueError, match="1024"):
        SuiteSettings(samples=1025)
    for bad in (math.inf, -math.inf, math.nan, -0.5):
        with pytest.raises(ValueError, match="temperature"):
            SuiteSettings(samples=2, temperature=bad)
    assert SuiteSettings(samples=1024).samples == 1024
