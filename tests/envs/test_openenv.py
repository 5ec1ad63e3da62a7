"""OpenEnv interop, both directions, against the real openenv-core package."""

import asyncio

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("openenv.core")
import httpx
from openenv.core import GenericEnvClient
from openenv.core.env_server import (
    Action,
    Environment,
    Observation,
    State,
    create_fastapi_app,
)

from posttrain.envs.openenv_client import OpenEnvClient, OpenEnvTextEnv
from posttrain.envs.openenv_server import create_task_app
from posttrain.envs.task import Task
from posttrain.rewards.rubric import Rubric
from posttrain.sampling.http_serve import serve_in_loop
from posttrain.sampling.scripted import ScriptedSampler
from posttrain.types import SampleParams


class SayAction(Action):
    message: str


class CountObservation(Observation):
    prompt: str = ""
    heard: list[str] = []


class CountingEnv(Environment):
    """Asks for a word `turns` times; reward 1 for each reply that contains the target letter."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self._state = State(episode_id=None, step_count=0)
        self.heard: list[str] = []
        self.letter, self.turns = "a", 2

    def reset(self, seed=None, episode_id=None, letter="a", turns=2, **kw):
        self._state = State(episode_id=episode_id or "ep", step_count=0)
        self.heard, self.letter, self.turns = [], letter, turns
        return CountObservation(prompt=f"Say a word with the letter {letter}.")

    def step(self, action, timeout_s=None, **kw):
        self._state.step_count += 1
        self.heard.append(action.message)
        done = self._state.step_count >= self.turns
        return CountObservation(prompt="Another one.", heard=list(self.heard), done=done,
                                reward=1.0 if self.letter in action.message else 0.0)

    @property
    def state(self):
        return self._state


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_our_client_plays_an_openenv_core_environment(tiny):
    _, tok = tiny
    app = create_fastapi_app(CountingEnv, SayAction, CountObservation, max_concurrent_envs=4)

    async def go():
        async with serve_in_loop(app) as srv:
            async with OpenEnvClient(srv.url, timeout_s=10) as c:
                assert (await c.get("/health"))["status"] == "healthy"
                first = await c.reset(letter="b")
                st = await c.state()
            env = OpenEnvTextEnv(srv.url, tok, SampleParams(max_tokens=8), max_turns=5, timeout_s=10)
            trajs = await asyncio.gather(*(env.rollout({"prompt": "", "letter": "a"}, ScriptedSampler(tok, ["apple", "kiwi"]))
                                           for _ in range(2)))
            return first, st, trajs

    first, st, trajs = run(go())
    assert first["observation"]["prompt"] == "Say a word with the letter b." and first["done"] is False
    assert st["step_count"] == 0
    for t in trajs:
        assert not t.failed and t.reward == 1.0 and t.passed, t.error
        assert len(t.turns) == 2 and t.completion_text == "kiwi"
        _tokens, _mask, _ = t.sequence()  # raises if the second prompt does not extend the first turn
        assert "Another one." in tok.decode(t.turns[1].prompt_ids)
        assert tok.decode(t.turns[0].prompt_ids).count("letter a") == 1


def _task():
    def says_yes(completions, **kw):
        return [1.0 if "yes" in c else 0.0 for c in completions]

    rows = [{"prompt": "Is the sky blue?"}, {"prompt": "Is water wet?"}]
    return Task("yes", rows, rows[:1], Rubric.from_funcs([says_yes]))


def test_openenv_core_client_plays_our_served_task(tiny):
    _, tok = tiny
    app = create_task_app(_task(), tok, action_timeout_s=10)

    async def go():
        async with serve_in_loop(app) as srv:
            async with GenericEnvClient(base_url=srv.url) as env:
                r0 = await env.reset(index=1)
                r1 = await env.step({"message": "yes, it is"})
                st = await env.state()
                r2 = await env.reset(index=0)
                r3 = await env.step({"message": "no"})
                with pytest.raises(RuntimeError, match="done"):
                    await env.step({"message": "again"})
                with pytest.raises(RuntimeError, match="message"):
                    await env.reset()
                    await env.step({"text": "wrong key"})
            async with httpx.AsyncClient(base_url=srv.url, timeout=10) as h:
                one_shot = (await h.post("/step", json={"action": {"message": "yes"}, "index": 0})).json()
                schema = (await h.get("/schema")).json()
                bad = await h.post("/step", json={"action": {"nope": 1}})
            return r0, r1, st, r2, r3, one_shot, schema, bad

    r0, r1, st, r2, r3, one_shot, schema, bad = run(go())
    assert r0.done is False and r0.observation["task_prompt"] == "Is water wet?"
    assert "Is water wet?" in r0.observation["prompt"]
    assert r1.done is True and r1.reward == 1.0 and r1.observation["passed"] is True
    assert st["step_count"] == 1
    assert r2.observation["task_prompt"] == "Is the sky blue?" and r3.reward == 0.0
    assert one_shot["done"] is True and one_shot["reward"] == 1.0
    assert schema["action"]["required"] == ["message"] and bad.status_code == 422
