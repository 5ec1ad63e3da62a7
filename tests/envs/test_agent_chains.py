"""AgentEnv trains every call: an agent whose calls do not extend one another (it rewrites its history, like
smolagents, or leaves a reply out of it, like mini-swe-agent) becomes one training sequence per chain of calls,
each with the episode's reward and advantage, and nothing is dropped."""

import asyncio
import logging

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("openai")

from posttrain.envs.agent import AgentEnv
from posttrain.loop.batch import BatchOptions, build_batch, sequences_from_groups
from posttrain.sampling.scripted import CapturingSampler, ScriptedSampler
from posttrain.types import Group, Trajectory

SYSTEM = {"role": "system", "content": "You are an agent. Think, then act."}


async def rewriter(client, row):
    """smolagents-like: every call is a fresh conversation whose one user message restates the task and a summary
    of the steps so far, so no call's prompt extends the previous call's prompt + reply."""
    if not row.get("split", True):
        await client.chat.completions.create(model="policy", messages=[SYSTEM, {"role": "user", "content": "go"}])
        return row["reward"]
    notes = ""
    for i in range(3):
        msgs = [SYSTEM, {"role": "user", "content": f"Task: {row['prompt']}\nMemory:{notes}\nStep {i}."}]
        r = await client.chat.completions.create(model="policy", messages=msgs, max_tokens=8)
        notes += f"\n- step {i}: {r.choices[0].message.content}"
    return row["reward"]


async def mini_swe(client, row):
    """mini-swe-agent-like: a reply without a command is left out of the history (a format error is added in its
    place), so the next call does not extend it."""
    msgs = [SYSTEM, {"role": "user", "content": f"Fix the bug: {row['prompt']}"}]
    for _ in range(3):
        r = await client.chat.completions.create(model="policy", messages=msgs, max_tokens=8)
        text = r.choices[0].message.content or ""
        if "```bash" in text:
            msgs += [{"role": "assistant", "content": text}, {"role": "user", "content": "(exit 0)"}]
        else:
            msgs += [{"role": "user", "content": "Format error: reply with one ```bash block."}]
    return row["reward"]


def _run(env, rows, sampler):
    async def go():
        trajs = [await env.rollout(r, sampler) for r in rows]
        await env.close()
        return trajs

    return asyncio.run(go())


def _sampled_tokens(sampler: CapturingSampler) -> int:
    return sum(len(c.token_ids) for _, c in sampler.seen)


@pytest.mark.parametrize(
    ("agent", "texts", "chains"),
    [
        (rewriter, ["plan it", "look around", "answer 42"], 3),
        (mini_swe, ["let me think", "hmm, still thinking", "```bash\nls\n```"], 3),
    ],
)
def test_every_call_of_an_agent_that_breaks_its_history_is_trained(tiny, caplog, agent, texts, chains):
    _, tok = tiny
    sampler = CapturingSampler(ScriptedSampler(tok, texts))
    env = AgentEnv(agent, tokenizer=tok, timeout_s=30)
    with caplog.at_level(logging.WARNING, logger="posttrain.envs.agent"):
        trajs = _run(env, [{"prompt": "p", "reward": 1.0}, {"prompt": "p", "reward": 0.0}], sampler)
    a, b = trajs
    assert not a.failed and a.metrics["agent/chains"] == chains and a.metrics["agent/dropped_calls"] == 0
    assert b.metrics["agent/dropped_calls"] == 0
    assert len(a.extra_chains) == chains - 1
    seqs = sequences_from_groups([Group(0, trajs)])
    assert len(seqs) == 2 * chains
    # Every sampled token is trained, exactly once (and counted: the staleness bound checks every one).
    assert sum(sum(s.loss_mask) for s in seqs) == _sampled_tokens(sampler)
    assert sum(t.num_completion_tokens for t in trajs) == sum(len(t.token_versions()) for t in trajs)
    assert sum(t.num_completion_tokens for t in trajs) == _sampled_tokens(sampler)
    batch, _ = build_batch(seqs, BatchOptions())
    assert batch.total_seqs == 2  # episodes, not pieces
    adv_a = {s.advantage for s in batch.sequences if s.reward == 1.0}
    adv_b = {s.advantage for s in batch.sequences if s.reward == 0.0}
    assert len(adv_a) == 1 and len(adv_b) == 1 and adv_a.pop() > 0 > adv_b.pop()
    # Said once in the console, however many episodes split.
    said = [r for r in caplog.records if "chains" in r.getMessage()]
    assert len(said) == 1 and "trained" in said[0].getMessage()


def test_the_group_statistics_count_an_episode_once_however_many_pieces_it_has(tiny):
    """A 3-piece episode with reward 1 and a whole one with reward 0: GRPO's mean is 0.5 (per episode), so their
    advantages are opposite. Counted per piece the mean would be 0.75."""
    _, tok = tiny
    env = AgentEnv(rewriter, tokenizer=tok, timeout_s=30)
    rows = [{"prompt": "p", "reward": 1.0}, {"prompt": "p", "reward": 0.0, "split": False}]
    trajs = _run(env, rows, ScriptedSampler(tok, ["one", "two", "three", "four"]))
    assert [t.metrics["agent/chains"] for t in trajs] == [3, 1]
    seqs = sequences_from_groups([Group(0, trajs)])
    assert len(seqs) == 4
    batch, m = build_batch(seqs, BatchOptions())
    by_reward = {s.reward: s.advantage for s in batch.sequences}
    assert by_reward[1.0] == pytest.approx(-by_reward[0.0]) and by_reward[1.0] > 0
    assert len({s.advantage for s in batch.sequences if s.reward == 1.0}) == 1
    assert m["adv/mean"] == pytest.approx(0.0, abs=1e-6)
    # The pieces of one episode: one carries the trajectory's sample id (what the report shows), all its episode.
    pieces = [s for s in seqs if s.reward == 1.0]
    assert len({s.episode for s in pieces}) == 1 and pieces[0].episode is not None
    assert all(s.episode_tokens == sum(sum(p.loss_mask) for p in pieces) for s in pieces)


def test_chains_longest_keeps_the_old_behaviour_and_says_what_it_dropped(tiny, caplog):
    _, tok = tiny
    env = AgentEnv(rewriter, tokenizer=tok, timeout_s=30, chains="longest")
    with caplog.at_level(logging.WARNING, logger="posttrain.envs.agent"):
        (t,) = _run(env, [{"prompt": "p", "reward": 1.0}], ScriptedSampler(tok, ["a", "bb bb", "c"]))
    assert t.extra_chains == [] and len(t.turns) == 1
    assert t.metrics["agent/chains"] == 3 and t.metrics["agent/dropped_calls"] == 2
    assert len(sequences_from_groups([Group(0, [t])])) == 1
    said = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert len(said) == 1 and "chains='all'" in said[0]


def test_the_final_reply_is_the_trajectory_s_last_turn(tiny):
    """The trajectory's own turns are the chain of the last call: its completion text is the final answer, which
    a rubric scores when the agent returns None."""
    _, tok = tiny

    env = AgentEnv(rewriter, tokenizer=tok, timeout_s=30)
    (t,) = _run(env, [{"prompt": "p", "reward": 1.0}], ScriptedSampler(tok, ["a much longer first reply", "b", "c"]))
    assert t.completion_text == "c" and len(t.turns) == 1 and len(t.extra_chains) == 2


def test_a_trajectory_with_extra_chains_round_trips_through_json():
    from posttrain.types import Turn

    t = Trajectory(turns=[Turn([1], [2], [-0.1], 0)], extra_chains=[[Turn([3], [4, 5], [-0.2, -0.3], 0)]])
    back = Trajectory.from_dict(t.to_dict())
    assert back.extra_chains == t.extra_chains and isinstance(back.extra_chains[0][0], Turn)


def test_chains_must_be_all_or_longest(tiny):
    with pytest.raises(ValueError, match="chains"):
        AgentEnv(rewriter, tokenizer=tiny[1], chains="every")
