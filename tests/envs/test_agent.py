import asyncio

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("openai")

from posttrain.envs.agent import AgentEnv
from posttrain.envs.task import Task
from posttrain.loop.batch import sequences_from_groups
from posttrain.models import stop_token_ids
from posttrain.rewards.rubric import Rubric
from posttrain.sampling import HFSampler
from posttrain.sampling.scripted import CapturingSampler, ScriptedSampler
from posttrain.types import Group
from posttrain.envs.scoring import scored_by


async def two_step(client, row):
    msgs = [{"role": "user", "content": row["prompt"]}]
    r = await client.chat.completions.create(model="policy", messages=msgs, max_tokens=8)
    msgs += [{"role": "assistant", "content": r.choices[0].message.content}, {"role": "user", "content": "Sure?"}]
    r2 = await client.chat.completions.create(model="policy", messages=msgs, max_tokens=8)
    return {"reward": 0.5, "length": float(len(r2.choices[0].message.content))}


def _task():
    def has_yes(completions, **kw):
        return [1.0 if "yes" in c else 0.0 for c in completions]

    return Task("t", [{"prompt": "q", "answer": "yes"}], [], Rubric.from_funcs([has_yes]))


def test_two_step_agent_gives_one_trajectory_with_the_sampled_tokens(tiny):
    model, tok = tiny
    sampler = CapturingSampler(HFSampler(model, tok, stop_token_ids(model, tok), seed=0))
    env = AgentEnv(two_step, tokenizer=tok, timeout_s=30)

    async def go():
        trajs = await asyncio.gather(*(env.rollout({"prompt": "hello"}, sampler) for _ in range(3)))
        await env.score(list(trajs))
        await env.close()
        return trajs

    trajs = asyncio.run(go())
    assert not hasattr(env, "stats")  # what an episode counted is in its metrics, which the step's record reads
    assert [t.metrics for t in trajs] == [
        {
            "agent/calls": 2.0,
            "agent/chains": 1.0,
            "agent/dropped_calls": 0.0,
            "agent/temperature_overrides": 0.0,
            "agent/timed_out": 0.0,
        }
    ] * 3
    produced = {tuple(c.token_ids): c.logprobs for _, c in sampler.seen}
    for t in trajs:
        assert not t.failed and t.reward == 0.5 and "length" in t.reward_components
        assert len(t.turns) == 2
        for turn in t.turns:
            assert produced[tuple(turn.completion_ids)] == turn.completion_logprobs
    seqs = sequences_from_groups([Group(0, list(trajs))])
    assert len(seqs) == 3 and all(sum(s.loss_mask) > 0 for s in seqs)


def test_answer_is_scored_by_the_task_rubric(tiny):
    _, tok = tiny

    async def answer(client, row):
        r = await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": row["prompt"]}])
        return r.choices[0].message.content  # a string: the final answer, scored by the rubric

    async def last_reply(client, row):
        await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": row["prompt"]}])

    env = AgentEnv(answer, task=_task(), tokenizer=tok, timeout_s=30)
    env2 = AgentEnv(last_reply, task=_task(), tokenizer=tok, timeout_s=30)

    async def go():
        s = ScriptedSampler(tok, ["yes it is", "no"])
        t1 = await env.rollout({"prompt": "q", "answer": "yes"}, s)
        t2 = await env2.rollout({"prompt": "q", "answer": "yes"}, s)
        (t1,) = await scored_by(env, [t1])
        (t2,) = await scored_by(env2, [t2])
        await env.close()
        await env2.close()
        return t1, t2

    t1, t2 = asyncio.run(go())
    assert t1.reward == 1.0 and t1.passed and t1.completion_text == "yes it is"
    assert t2.reward == 0.0 and not t2.passed and t2.completion_text == "no"


def test_failing_and_slow_agents_give_failed_trajectories(tiny):
    _, tok = tiny

    async def broken(client, row):
        await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "x"}])
        raise KeyError("oops")

    async def slow(client, row):
        await asyncio.sleep(5)

    async def no_reward(client, row):
        await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "x"}])
        return [1]

    async def go():
        s = ScriptedSampler(tok, ["a"])
        out = []
        for fn in (broken, slow, no_reward):
            env = AgentEnv(fn, tokenizer=tok, timeout_s=0.3)
            t = await env.rollout({"prompt": "x"}, s)
            out.append((t, {"timeouts": t.metrics["agent/timed_out"]}))
            await env.close()
        return out

    (t1, _s1), (t2, s2), (t3, _s3) = asyncio.run(go())
    assert t1.failed and "KeyError" in t1.error and len(t1.turns) == 1 and t1.turns[0].completion_ids
    assert t2.failed and "timed out" in t2.error and s2["timeouts"] == 1 and t2.turns[0].completion_ids == []
    assert t3.failed and "must return" in t3.error
    assert sequences_from_groups([Group(0, [t1, t2, t3])]) == []


def test_the_tokenizer_is_required_not_borrowed_from_the_sampler():
    """The Sampler protocol has no tokenizer: an AgentEnv built without one is refused when it is built, not at its
    first rollout by a sampler that happens to carry one (issue 62's probes)."""
    with pytest.raises(TypeError, match="tokenizer"):
        AgentEnv(two_step, timeout_s=30)  # pyright: ignore[reportCallIssue] - the missing argument under test
