"""DAPO dynamic sampling with refill: zero-variance groups are replaced until the batch is full."""

import asyncio

from posttrain.algos.dapo import has_signal
from posttrain.config import load_config
from posttrain.loop import train
from posttrain.loop.dynamic_sampling import collect_groups, refill_rows
from posttrain.obs import read_metrics
from posttrain.types import Group, Trajectory, Turn


def _group(row: int) -> Group:
    # even rows: every completion gets the same reward (no signal); odd rows: rewards differ
    rewards = [0.5] * 4 if row % 2 == 0 else [0.0, 1.0, 0.0, 1.0]
    trajs = [Trajectory(turns=[Turn([1], [2], [0.0], 0)], reward=r) for r in rewards]
    return Group(task_index=row, trajectories_G=trajs)


def test_half_zero_variance_groups_are_refilled_to_a_full_batch():
    calls = []

    async def sample(rows):
        calls.append(list(rows))
        return [_group(r) for r in rows]

    kept, all_groups, stats = asyncio.run(collect_groups(
        sample, first_rows=list(range(8)), more_rows=lambda rnd, k, used: refill_rows(100, 0, rnd, k, 0, used),
        target=8, max_rounds=3, keep=lambda g: has_signal(g.rewards_G)))
    assert len(kept) == 8 and all(has_signal(g.rewards_G) for g in kept)
    m = stats.metrics()
    assert m["dynamic/batch_fill"] == 1.0
    assert m["dynamic/extra_rounds"] >= 1
    assert stats.sampled_groups == len(all_groups) == sum(len(c) for c in calls)
    assert m["dynamic/filtered_frac"] == sum(1 for g in all_groups if not has_signal(g.rewards_G)) / len(all_groups)
    # refill rows are fresh: no row of the first round is sampled again while others remain
    assert not set(calls[1]) & set(calls[0])


def test_refill_gives_up_after_max_rounds_and_trains_on_what_it_has():
    async def sample(rows):
        return [_group(2 * r) for r in rows]  # never any signal

    kept, _, stats = asyncio.run(collect_groups(sample, [0, 1], lambda rnd, k, used: [rnd * 10 + i for i in range(k)],
                                                target=2, max_rounds=2, keep=lambda g: has_signal(g.rewards_G)))
    assert kept == [] and stats.extra_rounds == 2 and stats.metrics()["dynamic/batch_fill"] == 0.0


def test_refill_rows_is_deterministic():
    assert refill_rows(50, 3, 1, 5, 0, {1, 2}) == refill_rows(50, 3, 1, 5, 0, {1, 2})
    assert set(refill_rows(10, 0, 1, 8, 0, set(range(5)))) == set(range(5, 10)) | set(
        refill_rows(10, 0, 1, 8, 0, set(range(5)))[5:])


def test_loop_with_dynamic_sampling_trains_only_on_groups_with_signal(tmp_path):
    task = tmp_path / "half.py"
    task.write_text(
        "def reward(completions, const, **kw):\n"
        "    return [0.5 if k else c[0]['content'].count('a') / max(len(c[0]['content']), 1)\n"
        "            for c, k in zip(completions, const)]\n"
        "def make_task():\n"
        "    rows = [{'prompt': [{'role': 'user', 'content': f'q{i}'}], 'const': i % 2 == 0} for i in range(40)]\n"
        "    return {'train': rows, 'rewards': [reward], 'max_tokens': 8}\n")
    cfg = load_config(None, ["model.name=tiny-random", f"task.name={task}:make_task", "logging.tensorboard=false",
                             "logging.console=false", "loop.eval_prompts=4", f"run.output_dir={tmp_path}",
                             "loop.steps=3", "loop.save_every=0", "loop.prompts_per_step=4",
                             "algorithm.name=dapo", "sampling.temperature=1.0"])
    res = train(cfg)
    recs = [r for r in read_metrics(str(res.run_dir)) if r["kind"] == "train"]
    for r in recs:
        assert r["groups/trained"] == 4 and r["dynamic/batch_fill"] == 1.0, r
    assert sum(r["dynamic/extra_rounds"] for r in recs) >= 1
    assert all(r["dynamic/filtered_frac"] > 0 for r in recs if r["dynamic/extra_rounds"] > 0)
