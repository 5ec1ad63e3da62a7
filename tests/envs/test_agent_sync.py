"""AgentEnv runs a plain `def agent(client, row)` in a worker thread with a blocking `openai.OpenAI` client, so a
sync framework (smolagents, langchain's .invoke, litellm, mini-swe-agent) cannot freeze the in-process server that
answers it; the timeout still holds."""

import asyncio
import functools
import threading
import time
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("openai")

import openai

from posttrain.envs.agent import AgentEnv
from posttrain.loop.batch import sequences_from_groups
from posttrain.sampling.scripted import ScriptedSampler
from posttrain.types import Group


def sync_agent(client, row):
    """Two blocking calls, the second continuing the first (as a sync framework writes it)."""
    assert isinstance(client, openai.OpenAI)
    msgs: list[Any] = [{"role": "user", "content": row["prompt"]}]
    r = client.chat.completions.create(model="policy", messages=msgs, max_tokens=8)
    msgs += [{"role": "assistant", "content": r.choices[0].message.content}, {"role": "user", "content": "Sure?"}]
    r2 = client.chat.completions.create(model="policy", messages=msgs, max_tokens=8)
    return 1.0 if r2.choices[0].message.content == "yes" else 0.0  # the scripted sampler says yes


async def async_agent(client, row):
    r = await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": row["prompt"]}])
    return 1.0 if r.choices[0].message.content else 0.0


def test_a_sync_agent_with_a_blocking_client_completes(tiny):
    _, tok = tiny
    env = AgentEnv(sync_agent, tokenizer=tok, timeout_s=30, request_timeout_s=20)

    async def go():
        s = ScriptedSampler(tok, ["yes"])
        trajs = await asyncio.gather(*(env.rollout({"prompt": "q"}, s) for _ in range(2)))
        await env.close()
        return trajs

    trajs = asyncio.run(go())
    for t in trajs:
        assert not t.failed, t.error
        assert len(t.turns) == 2 and t.metrics["agent/chains"] == 1
    assert sorted(t.reward for t in trajs) == [1.0, 1.0]
    assert len(sequences_from_groups([Group(0, list(trajs))])) == 2


def test_a_sync_agent_that_blocks_fails_as_timed_out_while_an_async_one_succeeds(tiny):
    _, tok = tiny
    release = threading.Event()

    def stuck(client, row):
        client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "x"}], max_tokens=4)
        release.wait(12)  # "forever" for this test; released at its end so no thread outlives it

    stuck_env = AgentEnv(stuck, tokenizer=tok, timeout_s=1.0)
    ok_env = AgentEnv(async_agent, tokenizer=tok, timeout_s=30)

    async def go():
        s = ScriptedSampler(tok, ["fine"])
        t0 = time.monotonic()

        async def timed(coro):
            t = await coro
            return t, time.monotonic() - t0

        out = await asyncio.gather(
            timed(stuck_env.rollout({"prompt": "x"}, s)),
            timed(ok_env.rollout({"prompt": "hello"}, s)),
        )
        await stuck_env.close()
        await ok_env.close()
        return out

    try:
        (stuck_t, stuck_s), (ok_t, ok_s) = asyncio.run(go())
    finally:
        release.set()
    assert stuck_t.failed and "timed out" in stuck_t.error and stuck_t.metrics["agent/timed_out"] == 1.0
    assert stuck_s < 8  # the timeout held (1 s), not the 12 s the thread blocks
    assert not ok_t.failed and ok_t.reward == 1.0 and ok_s < 8


def test_a_sync_agent_that_returns_a_coroutine_is_told_to_be_async(tiny):
    _, tok = tiny
    env = AgentEnv(lambda client, row: async_agent(client, row), tokenizer=tok, timeout_s=10)

    async def go():
        t = await env.rollout({"prompt": "x"}, ScriptedSampler(tok, ["a"]))
        await env.close()
        return t

    t = asyncio.run(go())
    assert t.failed and "async def" in (t.error or "")


class AsyncCallable:
    async def __call__(self, client, row):
        return 1.0


class SyncCallable:
    def __call__(self, client, row):
        return 1.0


@pytest.mark.parametrize(
    ("fn", "expected"),
    [
        (async_agent, True),
        (sync_agent, False),
        (functools.partial(async_agent), True),
        (functools.partial(functools.partial(sync_agent)), False),
        (AsyncCallable(), True),
        (SyncCallable(), False),
        (functools.partial(AsyncCallable()), True),
        (AsyncCallable().__call__, True),
    ],
)
def test_async_and_sync_agents_are_told_apart(fn, expected):
    from posttrain.envs.agent_runner import is_async_agent

    assert is_async_agent(fn) is expected


def test_sync_agents_stuck_past_their_timeout_are_capped():
    """A thread cannot be killed: one still running past its timeout counts as stuck, and at the cap a new sync
    agent is refused (its sample fails) instead of starting yet another thread; once it returns, they run again."""
    from posttrain.envs.agent_runner import SyncAgents, SyncAgentsStuck

    class Client:
        closed = 0

        def close(self):
            Client.closed += 1

    release = threading.Event()
    agents = SyncAgents(max_stuck=1)

    async def go():
        with pytest.raises(TimeoutError):
            await agents.run(lambda c, r: release.wait(12), Client(), {}, 0.2)
        assert agents.stuck == 1
        with pytest.raises(SyncAgentsStuck, match="max_stuck=1"):
            await agents.run(lambda c, r: 1.0, Client(), {}, 5)
        release.set()
        for _ in range(100):  # the stuck thread returns now
            if agents.stuck == 0:
                break
            await asyncio.sleep(0.05)
        return await agents.run(lambda c, r: r["x"], Client(), {"x": 2.0}, 5)

    try:
        assert asyncio.run(go()) == 2.0
    finally:
        release.set()
    assert agents.stuck == 0 and Client.closed == 3  # every client closed, the refused one's too
