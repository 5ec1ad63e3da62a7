"""Group-level scoring: a reward computed over all G completions of one prompt at once."""

import asyncio
import dataclasses

import pytest

from posttrain.config import load_config
from posttrain.envs.base import score_groups
from posttrain.envs.single_turn import SingleTurnEnv
from posttrain.tasks import count_a
from posttrain.loop import train
from posttrain.obs import read_metrics
from posttrain.sampling.scripted import ScriptedSampler
from posttrain.types import SampleParams


def shortest_wins(completions, **columns):
    """Rank within the group: 1 for the shortest completion(s), 0 for the others."""
    n = min(len(c) for c in completions)
    return [1.0 if len(c) == n else 0.0 for c in completions]


def _rolled_out(tok, texts, group_rewards):
    task = dataclasses.replace(count_a.make_task(), group_rewards=group_rewards)
    env = SingleTurnEnv(task, tok, SampleParams(max_tokens=8))
    sampler = ScriptedSampler(tok, texts)
    row = task.train_rows[0]

    async def go():
        trajs = [await env.rollout(row, sampler) for _ in texts]
        return [t for g in await score_groups(env, [trajs[:2], trajs[2:]]) for t in g]

    return asyncio.run(go())


def test_group_reward_sees_each_group_once_and_adds_to_the_reward(tiny):
    _, tok = tiny
    calls = []

    def spy(completions, **cols):
        calls.append(list(completions))
        return shortest_wins(completions)

    trajs = _rolled_out(tok, ["a", "a a a", "b b", "b"], [spy])
    assert calls == [["a", "a a a"], ["b b", "b"]]  # one call per group, with that group's G completions
    assert [t.reward_components["spy"] for t in trajs] == [1.0, 0.0, 0.0, 1.0]
    plain = _rolled_out(tok, ["a", "a a a", "b b", "b"], [])
    assert [t.reward - p.reward for t, p in zip(trajs, plain)] == pytest.approx([1.0, 0.0, 0.0, 1.0])


def test_a_raising_or_wrong_sized_group_reward_fails_only_its_group(tiny):
    _, tok = tiny

    def picky(completions, **cols):
        if "b" in completions[0]:
            raise RuntimeError("judge down")
        return [0.5] * len(completions)

    trajs = _rolled_out(tok, ["a", "a a", "b", "b b"], [picky])
    assert [t.failed for t in trajs] == [False, False, True, True]
    assert "judge down" in trajs[2].error
    short = _rolled_out(tok, ["a", "a a", "b", "b b"], [lambda completions, **c: [1.0]])
    assert all(t.failed and "returned 1 scores" in t.error for t in short)


def test_a_group_reward_that_is_not_finite_fails_its_group(tiny):
    """Issue #52: a NaN or infinity from a group reward (a ranking judge's, a tournament's) was added to the reward."""
    _, tok = tiny

    def broken(completions, **cols):
        return [float("nan") if "b" in completions[0] else 1.0, float("inf") if "b" in completions[0] else 0.0]

    trajs = _rolled_out(tok, ["a", "a a", "b", "b b"], [broken])
    assert [t.failed for t in trajs] == [False, False, True, True]
    assert "not a finite number" in trajs[2].error


def test_a_custom_task_with_a_group_reward_trains(tmp_path):
    task_file = tmp_path / "ranked.py"
    task_file.write_text(
        "def has_a(completions, **kw):\n"
        "    return [float('a' in c) for c in completions]\n"
        "def fewest_chars(completions, **kw):\n"
        "    n = min(len(c) for c in completions)\n"
        "    return [0.5 if len(c) == n else 0.0 for c in completions]\n"
        "def make_task():\n"
        "    rows = [{'prompt': f'q{i}'} for i in range(12)]\n"
        "    return {'train': rows, 'rewards': [has_a], 'group_rewards': [fewest_chars], 'max_tokens': 6}\n")
    cfg = load_config(None, ["model.name=tiny-random", f"task.name={task_file}:make_task", "loop.steps=2",
                             "loop.save_every=0", "logging.console=false", "logging.tensorboard=false",
                             f"run.output_dir={tmp_path}", "loop.eval_prompts=2", "task.env_check=off"])
    res = train(cfg)
    recs = [r for r in read_metrics(str(res.run_dir)) if r["kind"] == "train"]
    assert len(recs) == 2 and all("reward/fewest_chars" in r for r in recs)
    assert all(0.0 < r["reward/fewest_chars"] <= 0.5 for r in recs)  # at least one per group wins
