"""Use an OpenEnv environment server as a posttrain Env (multi-turn: observation -> user message, reply -> action).

OpenEnv (openenv-core 0.3) keeps episode state only in a WebSocket session at `/ws`; its HTTP `/reset` and
`/step` build a fresh environment for every request, so a multi-turn episode must use the WebSocket protocol:

    -> {"type": "reset", "data": {"seed": ..., ...}}      <- {"type": "observation", "data": {"observation": {...},
    -> {"type": "step", "data": ACTION}                                                 "reward": r, "done": d}}
    -> {"type": "state"}                                   <- {"type": "state", "data": {...}}
    -> {"type": "close"}                                   errors: {"type": "error", "data": {"message", "code"}}

`OpenEnvClient` speaks that protocol (plus the HTTP GET routes) with a timeout on every call, needing only
`websockets` and `httpx`, not openenv-core. `OpenEnvTextEnv` plays an episode with the policy: it renders each
observation as a user message (see `observation_text`), samples a reply with the chat template (later turns
extend the earlier tokens exactly, so the Trajectory keeps the prefix contract), sends `{action_key: reply}` as
the action, and sums the step rewards into the trajectory's reward.
"""

from __future__ import annotations

from dataclasses import replace

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

import httpx
from typing_extensions import Self

from posttrain.bounded import BoundedError, loads_json
from posttrain.sampling.base import Sampler
from posttrain.sampling.chat_prompt import ChatRenderer
from posttrain.sampling.recorder import RecordedCall, chain_to_trajectory, split_chains
from posttrain.types import SampleParams, Trajectory, Turn

log = logging.getLogger(__name__)
TEXT_KEYS = ("task_prompt", "prompt", "message", "text", "echoed_message", "observation", "content")


class OpenEnvError(RuntimeError):
    pass


class OpenEnvClient:
    """One WebSocket session with an OpenEnv server. `async with OpenEnvClient(url) as env: await env.reset()`."""

    def __init__(self, base_url: str, timeout_s: float = 60.0, connect_timeout_s: float = 10.0,
                 max_message_bytes: int = 100 * 1024 * 1024):
        self.base_url = base_url.rstrip("/")
        if self.base_url.startswith("ws"):
            self.base_url = "http" + self.base_url[2:]
        self.ws_url = "ws" + self.base_url[4:] + "/ws"
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.max_message_bytes = max_message_bytes
        self._ws: Any = None

    async def connect(self) -> OpenEnvClient:
        from websockets.asyncio.client import connect

        if self._ws is None:
            try:
                self._ws = await connect(self.ws_url, open_timeout=self.connect_timeout_s, max_size=self.max_message_bytes,
                                         proxy=None)
            except Exception as e:
                raise OpenEnvError(f"cannot connect to {self.ws_url}: {e}") from e
        return self

    async def close(self) -> None:
        if self._ws is not None:
            try:
                await asyncio.wait_for(self._ws.send(json.dumps({"type": "close"})), self.connect_timeout_s)
            except Exception:  # noqa: BLE001 - best effort, the connection is closed next anyway
                pass
            await self._ws.close()
            self._ws = None

    async def __aenter__(self) -> Self:
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _call(self, message: dict[str, Any]) -> dict[str, Any]:
        await self.connect()
        try:
            await asyncio.wait_for(self._ws.send(json.dumps(message)), self.timeout_s)
            reply = loads_json(await asyncio.wait_for(self._ws.recv(), self.timeout_s))
        except asyncio.TimeoutError:
            raise OpenEnvError(f"{message.get('type')} on {self.ws_url}: no answer within {self.timeout_s}s") from None
        except BoundedError as e:  # a server's reply: size and depth capped, one error type
            raise OpenEnvError(f"{message.get('type')} on {self.ws_url}: unreadable reply: {e}") from None
        if not isinstance(reply, dict):
            raise OpenEnvError(f"{message.get('type')} on {self.ws_url}: reply is not a JSON object")
        if reply.get("type") == "error":
            d = reply.get("data") or {}
            raise OpenEnvError(f"{message.get('type')} on {self.ws_url}: {d.get('message')} (code {d.get('code')})")
        return reply.get("data") or {}

    async def reset(self, **kwargs: Any) -> dict[str, Any]:
        """-> {"observation": {...}, "reward": float | None, "done": bool}"""
        return await self._call({"type": "reset", "data": kwargs})

    async def step(self, action: dict[str, Any]) -> dict[str, Any]:
        return await self._call({"type": "step", "data": action})

    async def state(self) -> dict[str, Any]:
        return await self._call({"type": "state"})

    async def get(self, path: str) -> dict[str, Any]:
        """GET /health, /metadata or /schema."""
        async with httpx.AsyncClient(timeout=self.timeout_s) as h:
            r = await h.get(self.base_url + path)
            r.raise_for_status()
            return r.json()


def observation_text(obs: Any) -> str | list[dict[str, Any]]:
    """The user-facing text of an observation: the first of TEXT_KEYS that holds a string (or, for
    `task_prompt`, a list of chat messages, returned as is), else the observation as JSON."""
    if isinstance(obs, str):
        return obs
    if isinstance(obs, dict):
        for k in TEXT_KEYS:
            v = obs.get(k)
            if isinstance(v, str) and v:
                return v
            if k == "task_prompt" and isinstance(v, list) and v:
                return v
    return json.dumps(obs, default=str)


class OpenEnvTextEnv:
    """An OpenEnv text environment as a posttrain Env.

    `reset_kwargs(row)` gives the reset data for a task row (default: the row minus `prompt`); `render` turns an
    observation into a user message (default `observation_text`); the action is `{action_key: reply text}`.
    The episode ends when the server says done or after `max_turns` replies; the reward is the sum of step
    rewards (None counts as 0). A server error or timeout ends the episode as a failed trajectory.
    """

    def __init__(self, base_url: str, tokenizer: Any, params: SampleParams, action_key: str = "message",
                 system_prompt: str | None = None, max_turns: int = 8, timeout_s: float = 60.0,
                 reset_kwargs: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
                 render: Callable[[Any], str | list[dict[str, Any]]] = observation_text, pass_threshold: float = 1.0):
        self.base_url = base_url
        self.renderer = ChatRenderer(tokenizer)
        self.params = params
        self.action_key = action_key
        self.system_prompt = system_prompt
        self.max_turns = max_turns
        self.timeout_s = timeout_s
        self.reset_kwargs = reset_kwargs or (lambda row: {k: v for k, v in row.items() if k != "prompt"})
        self.render = render
        self.pass_threshold = pass_threshold

    def _user(self, obs: Any) -> list[dict[str, Any]]:
        text = self.render(obs)
        return list(text) if isinstance(text, list) else [{"role": "user", "content": text}]

    async def rollout(self, row: dict[str, Any], sampler: Sampler, params: SampleParams | None = None) -> Trajectory:
        params = params or self.params
        keep = replace(params, keep_prefix=True)  # the next turn extends this one: keep its KV
        calls: list[RecordedCall] = []
        error, rewards_seen = None, []
        async with OpenEnvClient(self.base_url, timeout_s=self.timeout_s) as env:
            try:
                res = await env.reset(**self.reset_kwargs(row))
                messages = ([{"role": "system", "content": self.system_prompt}] if self.system_prompt else [])
                messages += self._user(res.get("observation"))
                for _ in range(self.max_turns):
                    if res.get("done"):
                        break
                    prev = calls[-1] if calls else None
                    ids = (self.renderer.splice(prev, messages, None) if prev else None) or \
                        self.renderer.render(messages, None)
                    (c,), = await sampler.sample([ids], keep, n=1)
                    reply = {"role": "assistant", "content": c.text}
                    calls.append(RecordedCall(ids, c.token_ids, c.logprobs, c.policy_version, c.finish_reason,
                                              text=c.text, messages=list(messages), reply=reply,
                                              token_versions=c.token_versions))
                    res = await env.step({self.action_key: c.text})
                    if res.get("reward") is not None:
                        rewards_seen.append(float(res["reward"]))
                    messages = messages + [reply] + self._user(res.get("observation"))
            except (OpenEnvError, OSError) as e:
                error = str(e)
        if not calls:
            traj = Trajectory(turns=[Turn([], [], [], sampler.policy_version)], row=dict(row))
            error = error or "the environment ended before the first model call"
        else:
            chains = split_chains(calls)
            if len(chains) > 1:  # a chat template that rewrites history; train on the longest chain
                log.warning("OpenEnv episode split into %d token chains; training on the longest", len(chains))
            traj = chain_to_trajectory(max(chains, key=lambda ch: sum(len(x.completion_ids) for x in ch)), row)
        reward = sum(rewards_seen)
        traj.reward, traj.passed = reward, reward >= self.pass_threshold
        traj.reward_components = {"env_reward": reward}
        traj.metrics.update({"openenv/turns": float(len(calls)), "openenv/split_chains": float(len(split_chains(calls)))})
        if error is not None:
            traj.failed, traj.error, traj.reward, traj.passed = True, error, 0.0, False
        return traj

    async def score(self, trajectories: list[Trajectory]) -> None:
        """Rewards come from the environment's steps, set in rollout."""
        return
