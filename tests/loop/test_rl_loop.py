"""End-to-end loop tests on tiny-random: learning, resume, failures that must not stop a run."""

import json

import pytest

from posttrain.config import load_config
from posttrain.loop import Run, train
from posttrain.algos.prompt_selection import prompts_for_step
from posttrain.obs import read_metrics

FAST = ["model.name=tiny-random", "task.name=count-a", "logging.tensorboard=false", "logging.console=false",
        "loop.eval_prompts=8"]


def _cfg(tmp_path, *extra):
    return load_config(None, FAST + [f"run.output_dir={tmp_path}"] + list(extra))


def test_grpo_raises_reward_on_count_a(tmp_path):
    cfg = _cfg(tmp_path, "loop.steps=30", "loop.prompts_per_step=4", "algorithm.num_generations=8",
               "trainer.lr=3e-3", "loop.save_every=0")
    res = train(cfg)
    recs = [r for r in read_metrics(str(res.run_dir)) if r["kind"] == "train"]
    first = sum(r["reward/mean"] for r in recs[:5]) / 5
    last = sum(r["reward/mean"] for r in recs[-5:]) / 5
    assert last > first + 0.3, (first, last)
    assert res.after["eval/reward/mean"] > res.before["eval/reward/mean"] + 0.3
    # the run directory is complete
    for f in ("config.yaml", "run_info.json", "metrics.jsonl", "samples.jsonl", "summary.json"):
        assert (res.run_dir / f).exists(), f
    assert (res.run_dir / "final" / "config.json").exists()
    # memory is logged each step and summed up (the memory_pressure diagnostic reads it)
    assert all(r["perf/peak_rss_mb"] > 100 for r in recs)
    assert json.loads((res.run_dir / "summary.json").read_text())["peak_rss_mb"] >= recs[-1]["perf/peak_rss_mb"] - 1


def _train_records(run_dir):
    drop = ("time/", "perf/")
    return [{k: v for k, v in r.items() if not k.startswith(drop)}
            for r in read_metrics(str(run_dir)) if r["kind"] == "train"]


def test_resume_after_crash_gives_identical_metrics(tmp_path, crash_in_rl):
    common = ["loop.steps=6", "loop.save_every=3", "trainer.lr=1e-3", "run.seed=3"]
    straight = train(_cfg(tmp_path / "a", *common))

    cfg = _cfg(tmp_path / "b", *common, "run.name=crashy")
    run = crash_in_rl(cfg, at_step=3)
    resumed = Run(cfg, run_dir=run.run_dir, resume=True).run()

    a, b = _train_records(straight.run_dir), _train_records(resumed.run_dir)
    assert [r["step"] for r in b] == [1, 2, 3, 4, 5, 6]
    assert a == b


def test_raising_reward_function_does_not_stop_the_run(tmp_path):
    task_file = tmp_path / "flaky.py"
    task_file.write_text(
        "def reward(completions, **kw):\n"
        "    out = []\n"
        "    for c in completions:\n"
        "        text = c[0]['content']\n"
        "        if len(text) % 3 == 0:\n"
        "            raise ValueError('boom')\n"
        "        out.append(text.count('a') / max(len(text), 1))\n"
        "    return out\n"
        "def make_task():\n"
        "    rows = [{'prompt': [{'role': 'user', 'content': f'q{i}'}]} for i in range(20)]\n"
        "    return {'train': rows, 'rewards': [reward], 'max_tokens': 8}\n")
    # env_check=off: the pre-training check would (rightly) refuse this reward, which raises on an empty reply
    cfg = _cfg(tmp_path, f"task.name={task_file}:make_task", "loop.steps=3", "loop.save_every=0",
               "sampling.eval_temperature=1.0", "task.env_check=off")
    res = train(cfg)
    recs = [r for r in read_metrics(str(res.run_dir)) if r["kind"] == "train"]
    assert len(recs) == 3
    assert sum(r["rollouts/failed"] for r in recs) > 0
    samples = [json.loads(line) for line in (res.run_dir / "samples.jsonl").read_text().splitlines()]
    assert any(s.get("error") and "boom" in s["error"] for s in samples) or sum(r["rollouts/failed"] for r in recs)


def test_prompts_for_step_is_deterministic_and_covers_epochs():
    a = [prompts_for_step(10, s, 4, seed=1) for s in range(5)]
    assert a == [prompts_for_step(10, s, 4, seed=1) for s in range(5)]
    flat = [i for s in a for i in s]
    assert sorted(flat[:10]) == list(range(10))  # first epoch visits every row once


def test_a_time_budget_stops_the_run_after_the_step_that_spends_it_and_still_evaluates(tmp_path):
    """loop.time_budget_s (the README's cap for `make demo` on a slow machine): the run ends early, then saves
    and evaluates as a finished one does."""
    cfg = _cfg(tmp_path, "loop.steps=50", "loop.prompts_per_step=2", "loop.time_budget_s=0.001")
    res = train(cfg)
    recs = [r for r in read_metrics(str(res.run_dir)) if r["kind"] == "train"]
    assert len(recs) == 1
    assert "eval/reward/mean" in res.after and (res.run_dir / "final" / "config.json").exists()
