"""The `reversal` task: options (clear errors), disjoint train / held-out maps, an episode played through the text
adapter by a scripted policy (the oracle's plan) and by the tiny random model through the real HF sampler, the
step metrics (drain_metrics), the smoke checks and the demonstrations."""

import asyncio

import pytest

from posttrain.envs.base import score_groups
from posttrain.envs.smoke_checks import check_task
from posttrain.envs.task import TaskLoadError
from posttrain.tasks.load import load_task
from posttrain.tasks.reversal.grid import ACTION_NAMES
from posttrain.tasks.reversal.gym_env import ReversalGridEnv
from posttrain.tasks.reversal.task import oracle_plan
from posttrain.rewards.telemetry import drain_task_metrics
from posttrain.sampling.scripted import ScriptedSampler
from posttrain.types import SampleParams


@pytest.mark.parametrize("opts, msg", [({"mode": "forever"}, "mode must be one of"), ({"rho": 2}, r"rho must be in"),
                                       ({"rho": "lots"}, "rho must be a number"), ({"shield": "maybe"}, "'on' or 'off'"),
                                       ({"size": 40}, "size must be in"), ({"colour": "red"}, "rejected options")])
def test_bad_options_fail_clearly(opts, msg):
    with pytest.raises(TaskLoadError, match=msg):
        load_task("reversal", opts)


def test_train_and_held_out_maps_are_disjoint():
    task = load_task("reversal", {"n_train": 40, "n_eval": 20, "size": 5})
    env = ReversalGridEnv(size=5, rho=0.5)

    def prints(rows):
        out = set()
        for r in rows:
            env.reset(seed=r["seed"])
            out.add(env.map.fingerprint())
        return out

    assert not {r["seed"] for r in task.train_rows} & {r["seed"] for r in task.eval_rows}
    assert not prints(task.train_rows) & prints(task.eval_rows) and len(task.eval_rows) == 20


@pytest.mark.parametrize("opts", [{}, {"mode": "reset_free", "shield": "on", "rho": 0.0, "size": 6}, {"rho": 1.0}])
def test_smoke_checks_pass(opts):
    task = load_task("reversal", opts)
    results = check_task(task)
    assert results and all(r.ok for r in results), [(r.check, r.got) for r in results]


def test_scripted_oracle_episode_scores_one_and_logs_metrics():
    from posttrain.models.tiny import tiny_tokenizer

    tok = tiny_tokenizer()
    task = load_task("reversal", {"mode": "reset_free", "n_goals": 2, "size": 5})
    env = task.env_factory(task, tok, SampleParams(max_tokens=8))
    row = task.train_rows[0]
    replies = task.demonstrate(row)
    assert replies == [ACTION_NAMES[a] for a in oracle_plan(ReversalGridEnv(size=5, mode="reset_free", n_goals=2),
                                                              row["seed"])]
    good = asyncio.run(env.rollout(row, ScriptedSampler(tok, [f"I go {w}" for w in replies])))
    bad = asyncio.run(env.rollout(row, ScriptedSampler(tok, ["no idea", "stay"])))
    ((good, bad),) = asyncio.run(score_groups(env, [[good, bad]]))
    assert good.reward == 1.0 and good.passed and good.metrics["goals"] == 2.0
    assert bad.reward == 0.0 and bad.metrics["bad_actions"] >= 1
    m = drain_task_metrics(task)
    assert m["reversal/episodes"] == 2.0 and m["reversal/success"] == 0.5 and m["reversal/absorbed"] == 0.0
    assert 0.0 < m["reversal/bad_action_rate"] < 1.0 and m["reversal/turns"] > 1
    assert drain_task_metrics(task) == {}  # drained


def test_tiny_random_model_plays_through_the_hf_sampler(tiny):
    from posttrain.models.load import stop_token_ids
    from posttrain.sampling.hf_sampler import HFSampler

    model, tok = tiny
    task = load_task("reversal", {"max_turns": 3, "size": 5, "shield": "on"})
    env = task.env_factory(task, tok, SampleParams(max_tokens=6, temperature=1.0))
    sampler = HFSampler(model, tok, stop_token_ids(model, tok), seed=0)

    async def group():
        trajs = list(await asyncio.gather(*(env.rollout(task.train_rows[0], sampler) for _ in range(2))))
        (scored,) = await score_groups(env, [trajs])
        return scored

    trajs = asyncio.run(group())
    for t in trajs:
        assert not t.failed, t.error
        assert 1 <= t.metrics["turns"] <= 3 and t.metrics["bad_actions"] + t.metrics["env_steps"] == t.metrics["turns"]
        tokens, mask, _ = t.sequence()  # the multi-turn prefix contract holds with real sampled tokens
        assert sum(mask) == sum(len(x.completion_ids) for x in t.turns)
    assert drain_task_metrics(task)["reversal/episodes"] == 2.0
