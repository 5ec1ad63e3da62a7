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

import asyncio
import json
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Self

import httpx

from posttrain.bounded import MAX_JSON_CHARS, BoundedError, loads_json, truncate_text
from posttrain.envs.scoring import failed, score_of
from posttrain.envs.tool_env import sample_turn
from posttrain.rewards.rubric import Score
from posttrain.sampling.base import Sampler
from posttrain.sampling.chat_prompt import ChatRenderer, content_text
from posttrain.sampling.recorder import RecordedCall, chain_to_trajectory, split_chains
from posttrain.types import SampleParams, Trajectory, Turn

log = logging.getLogger(__name__)
TEXT_KEYS = ("task_prompt", "prompt", "message", "text", "echoed_message", "observation", "content")
MAX_OBSERVATION_CHARS = 8000  # what one observation may put into the next prompt; Task.max_observation_chars too
MAX_SERVER_MESSAGE_CHARS = 300  # of a server's error message quoted in the trajectory's error


class OpenEnvError(RuntimeError):
    """The server failed this episode: no connection, a lost or cut connection, a timeout, a reply that is too
    large, not JSON or not what the protocol says, or an error reply. The episode fails; the run goes on."""


class OpenEnvClient:
    """One WebSocket session with an OpenEnv server. `async with OpenEnvClient(url) as env: await env.reset()`.

    Every call is bounded: a timeout on connecting, each send, each reply and closing; a reply larger than
    `max_message_bytes` is refused by the websocket library at the frame's header, before it is buffered. Every
    way a call can fail raises OpenEnvError naming what went wrong."""

    def __init__(
        self,
        base_url: str,
        timeout_s: float = 60.0,
        connect_timeout_s: float = 10.0,
        max_message_bytes: int = MAX_JSON_CHARS,
    ):
        self.base_url = base_url.rstrip("/")
        if self.base_url.startswith("ws"):
            self.base_url = "http" + self.base_url[2:]
        self.ws_url = "ws" + self.base_url[4:] + "/ws"
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.max_message_bytes = max_message_bytes
        self._ws: Any = None

    async def connect(self) -> Self:
        from websockets.asyncio.client import connect

        if self._ws is None:
            try:
                # max_size: the library refuses a larger frame at its header, before buffering it
                self._ws = await connect(
                    self.ws_url,
                    open_timeout=self.connect_timeout_s,
                    max_size=self.max_message_bytes,
                    close_timeout=self.connect_timeout_s,
                    proxy=None,
                )
            except Exception as e:  # noqa: BLE001 - refused, reset, not a websocket server, timeout: "cannot connect"
                raise OpenEnvError(f"cannot connect to {self.ws_url}: {type(e).__name__}: {e}") from None
        return self

    async def close(self) -> None:
        """Best effort and bounded: the episode's outcome is decided, and a server that never completes the
        closing handshake must not hold the rollout (the library aborts the connection after close_timeout)."""
        ws, self._ws = self._ws, None
        if ws is None:
            return
        for step in (lambda: ws.send(json.dumps({"type": "close"})), ws.close):
            try:
                await asyncio.wait_for(step(), 2 * self.connect_timeout_s)
            except Exception:  # noqa: BLE001 - the connection may already be gone: nothing left to do
                pass

    async def __aenter__(self) -> Self:
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _exchange(self, message: dict[str, Any], what: str) -> str:
        """Send one message and read the next one as text. The protocol has one reply per request, in order."""
        from websockets.exceptions import WebSocketException

        out = json.dumps(message)  # outside the try: a row that is not JSON is the caller's error, not the server's
        try:
            await asyncio.wait_for(self._ws.send(out), self.timeout_s)
            # decode=False: the bytes of text and binary frames alike; UTF-8 is checked below, so invalid text is
            # this reply's error at once rather than a closing handshake the server may never finish
            raw = await asyncio.wait_for(self._ws.recv(decode=False), self.timeout_s)
        except TimeoutError:  # before OSError: TimeoutError is one
            raise OpenEnvError(f"{what}: {self._why_no_answer()}") from None
        except (WebSocketException, OSError, EOFError) as e:
            raise OpenEnvError(f"{what}: {_connection_lost(e, self.max_message_bytes)}") from None
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise OpenEnvError(f"{what}: reply is not UTF-8 text ({e.reason} at byte {e.start})") from None

    def _why_no_answer(self) -> str:
        """A recv that timed out may be the library waiting for the server to close a connection it already failed
        (a frame over max_size is refused at its header): then that is the reason, not the wait."""
        sent = getattr(getattr(self._ws, "protocol", None), "close_sent", None)
        if sent is not None:
            return _close_reason(sent, self.max_message_bytes)
        return f"no answer within {self.timeout_s}s"

    async def _call(self, message: dict[str, Any], expect: str) -> dict[str, Any]:
        """The `data` of the reply to `message`, which must be a reply of type `expect`."""
        await self.connect()
        what = f"{message.get('type')} on {self.ws_url}"
        text = await self._exchange(message, what)
        try:
            reply = loads_json(text)  # a server's reply: size and depth capped, one error type
        except BoundedError as e:
            raise OpenEnvError(f"{what}: unreadable reply: {e}") from None
        return _reply_data(reply, expect, what)

    async def reset(self, **kwargs: Any) -> dict[str, Any]:
        """-> {"observation": {...}, "reward": float | None, "done": bool}"""
        return _observation_reply(
            await self._call({"type": "reset", "data": kwargs}, "observation"), f"reset on {self.ws_url}"
        )

    async def step(self, action: dict[str, Any]) -> dict[str, Any]:
        return _observation_reply(
            await self._call({"type": "step", "data": action}, "observation"), f"step on {self.ws_url}"
        )

    async def state(self) -> dict[str, Any]:
        return await self._call({"type": "state"}, "state")

    async def get(self, path: str) -> dict[str, Any]:
        """GET /health, /metadata or /schema: a JSON object, read up to `max_message_bytes`."""
        url = self.base_url + path
        try:
            async with httpx.AsyncClient(timeout=self.timeout_s) as h:
                body = await asyncio.wait_for(_read_capped(h, url, self.max_message_bytes), self.timeout_s)
            value = loads_json(body.decode("utf-8"))
        except TimeoutError:
            raise OpenEnvError(f"GET {url}: no answer within {self.timeout_s}s") from None
        except (httpx.HTTPError, OSError) as e:
            raise OpenEnvError(f"GET {url}: {type(e).__name__}: {e}") from None
        except (BoundedError, UnicodeDecodeError) as e:
            raise OpenEnvError(f"GET {url}: unreadable reply: {e}") from None
        if not isinstance(value, dict):
            raise OpenEnvError(f"GET {url}: reply is not a JSON object")
        return value


async def _read_capped(h: httpx.AsyncClient, url: str, cap: int) -> bytes:
    """The body of a successful GET, refused as soon as it is known to pass `cap` bytes (header or stream)."""
    async with h.stream("GET", url) as r:
        r.raise_for_status()
        if int(r.headers.get("content-length") or 0) > cap:
            raise BoundedError(f"reply larger than {cap} bytes (Content-Length {r.headers['content-length']})")
        body = bytearray()
        async for chunk in r.aiter_bytes():
            body += chunk
            if len(body) > cap:
                raise BoundedError(f"reply larger than {cap} bytes")
        return bytes(body)


def _connection_lost(e: BaseException, cap: int) -> str:
    """What a websocket failure means, in words (with its cause: 'stream ends after 13 bytes, expected 200')."""
    sent = getattr(e, "sent", None)
    if sent is not None and sent.code == 1009:
        return _close_reason(sent, cap)
    cause = f" ({type(e.__cause__).__name__}: {e.__cause__})" if e.__cause__ else ""
    return f"connection lost: {type(e).__name__}: {e}{cause}"


def _close_reason(sent: Any, cap: int) -> str:
    """Why the client closed the connection (`sent`: its close frame). 1009: a frame over max_size."""
    if sent.code == 1009:
        return f"reply larger than {cap} bytes, refused unread ({sent.reason})"
    return f"connection failed by the client: {sent}"


def _reply_data(reply: Any, expect: str, what: str) -> dict[str, Any]:
    """The `data` object of a reply of type `expect`. An error reply, a reply of another type (the answer to
    another request: the protocol has no request ids, the type is all there is to check) or data that is not an
    object raises OpenEnvError."""
    if not isinstance(reply, dict):
        raise OpenEnvError(f"{what}: reply is not a JSON object")
    kind, data = reply.get("type"), reply.get("data")
    if kind == "error":
        d = data if isinstance(data, dict) else {}
        msg = str(d.get("message"))[:MAX_SERVER_MESSAGE_CHARS]
        raise OpenEnvError(f"{what}: the server answered with an error: {msg} (code {str(d.get('code'))[:40]})")
    if kind != expect:
        raise OpenEnvError(f"{what}: reply of type {str(kind)[:40]!r}, expected {expect!r}")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise OpenEnvError(f"{what}: reply data is a JSON {type(data).__name__}, expected an object")
    return data


def _observation_reply(data: dict[str, Any], what: str) -> dict[str, Any]:
    """`data` of an observation reply, checked: `reward` a finite number or null, `done` a boolean or null
    (null: not done). A reward is summed and compared to a threshold; a string there must not reach float()."""
    reward, done = data.get("reward"), data.get("done")
    if reward is not None:
        ok = isinstance(reward, (int, float)) and not isinstance(reward, bool)
        try:
            ok = ok and math.isfinite(reward)
        except OverflowError:  # an int too large for a float
            ok = False
        if not ok:
            raise OpenEnvError(f"{what}: reward {str(reward)[:40]!r} is not a finite number")
    if done is not None and not isinstance(done, bool):
        raise OpenEnvError(f"{what}: 'done' is {str(done)[:40]!r}, expected true or false")
    return {**data, "reward": None if reward is None else float(reward), "done": bool(done)}


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


@dataclass
class _Episode:
    """What an episode has gathered so far: kept whole when the server fails it part way."""

    calls: list[RecordedCall] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    chars_cut: int = 0
    error: str | None = None
    context_stop: bool = False  # the next turn did not fit the sampler's context: the episode ended there


class OpenEnvTextEnv:
    """An OpenEnv text environment as a posttrain Env.

    `reset_kwargs(row)` gives the reset data for a task row (default: the row minus `prompt`); `render` turns an
    observation into a user message (default `observation_text`); the action is `{action_key: reply text}`.
    The episode ends when the server says done or after `max_turns` replies; the reward is the sum of step
    rewards (None counts as 0). Each observation puts at most `max_observation_chars` characters into the next
    prompt (the rest cut with a marker the model reads, `bounded.truncate_text`).

    Whatever the server does (refuses the connection, cuts or resets it, stalls, sends an oversized, unreadable
    or malformed reply, or an error), `rollout` returns a failed trajectory whose `error` says what: it never
    raises for the server's sake, so callers that roll out directly (warm start, RISED, insights, scripted play)
    need no isolation of their own. Errors of the sampler propagate as they are.
    """

    def __init__(
        self,
        base_url: str,
        tokenizer: Any,
        params: SampleParams,
        action_key: str = "message",
        system_prompt: str | None = None,
        max_turns: int = 8,
        timeout_s: float = 60.0,
        reset_kwargs: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
        render: Callable[[Any], str | list[dict[str, Any]]] = observation_text,
        pass_threshold: float = 1.0,
        max_observation_chars: int = MAX_OBSERVATION_CHARS,
    ):
        if max_observation_chars < 1:
            raise ValueError(f"max_observation_chars must be >= 1, got {max_observation_chars}")
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
        self.max_observation_chars = max_observation_chars

    def _user(self, obs: Any, ep: _Episode) -> list[dict[str, Any]]:
        """The observation as user message(s), cut to max_observation_chars in all."""
        text = self.render(obs)
        if isinstance(text, str):
            text, cut = truncate_text(text, self.max_observation_chars)
            ep.chars_cut += cut
            return [{"role": "user", "content": text}]
        messages, cut = _bounded_messages(text, self.max_observation_chars)
        ep.chars_cut += cut
        return messages

    async def rollout(self, row: dict[str, Any], sampler: Sampler, params: SampleParams | None = None) -> Trajectory:
        ep = _Episode()
        env = OpenEnvClient(self.base_url, timeout_s=self.timeout_s, connect_timeout_s=min(10.0, self.timeout_s))
        try:
            await self._play(env, row, sampler, replace(params or self.params, keep_prefix=True), ep)
        except OpenEnvError as e:  # the server's failure, whatever it was: this episode's, with the reason
            ep.error = str(e)
        finally:
            await env.close()
        return self._trajectory(row, sampler, ep)

    async def _play(
        self, env: OpenEnvClient, row: dict[str, Any], sampler: Sampler, keep: SampleParams, ep: _Episode
    ) -> None:
        """Reset, then sample and step until done or max_turns. `keep`: the next turn extends this one."""
        res = await env.reset(**self.reset_kwargs(row))
        messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        messages += self._user(res.get("observation"), ep)
        for _ in range(self.max_turns):
            if res["done"]:
                break
            prev = ep.calls[-1] if ep.calls else None
            ids = (self.renderer.splice(prev, messages, None) if prev else None) or self.renderer.render(messages, None)
            c = await sample_turn(sampler, ids, keep, first=not ep.calls)
            if c is None:  # the conversation outgrew the context: end here, trained on as truncated
                ep.context_stop = True
                break
            reply = {"role": "assistant", "content": c.text}
            ep.calls.append(
                RecordedCall(
                    ids,
                    c.token_ids,
                    c.logprobs,
                    c.policy_version,
                    c.finish_reason,
                    text=c.text,
                    messages=list(messages),
                    reply=reply,
                    token_versions=c.token_versions,
                )
            )
            res = await env.step({self.action_key: c.text})
            if res["reward"] is not None:
                ep.rewards.append(res["reward"])
            messages = messages + [reply] + self._user(res.get("observation"), ep)

    def _trajectory(self, row: dict[str, Any], sampler: Sampler, ep: _Episode) -> Trajectory:
        error = ep.error
        if not ep.calls:
            traj = Trajectory(turns=[Turn([], [], [], sampler.policy_version)], row=dict(row))
            error = error or "the environment ended before the first model call"
        else:
            chains = split_chains(ep.calls)
            if len(chains) > 1:  # a chat template that rewrites history; train on the longest chain
                log.warning("OpenEnv episode split into %d token chains; training on the longest", len(chains))
            traj = chain_to_trajectory(max(chains, key=lambda ch: sum(len(x.completion_ids) for x in ch)), row)
        if ep.context_stop and ep.calls:
            traj = replace(
                traj, turns=[*traj.turns[:-1], replace(traj.turns[-1], finish_reason="length")], stop_reason="context"
            )
        reward = sum(ep.rewards)
        traj = replace(
            traj,
            reward=reward,
            passed=reward >= self.pass_threshold,
            reward_components={"env_reward": reward},
            metrics={
                **traj.metrics,
                "openenv/turns": float(len(ep.calls)),
                "openenv/split_chains": float(len(split_chains(ep.calls))),
                "openenv/observation_chars_cut": float(ep.chars_cut),
                "context_stop": float(ep.context_stop),
            },
        )
        return failed(traj, error) if error is not None else traj

    async def score(self, trajectories: list[Trajectory]) -> list[Score]:
        """Rewards come from the environment's steps, set in rollout."""
        return [score_of(t) for t in trajectories]


def _bounded_messages(messages: Any, max_chars: int) -> tuple[list[dict[str, Any]], int]:
    """Chat messages an observation gave (OpenEnv's `task_prompt`), checked and cut to `max_chars` characters of
    content in all; -> (messages, characters cut). Anything else there is the server's error."""
    if not isinstance(messages, list):
        raise OpenEnvError(f"the observation rendered to a {type(messages).__name__}, not text or chat messages")
    out, left, cut = [], max_chars, 0
    for m in messages:
        try:
            if not (isinstance(m, dict) and isinstance(m.get("role"), str) and len(m["role"]) <= 40):
                raise ValueError("each message needs a short string 'role'")
            text, n = truncate_text(content_text(m.get("content")), max(left, 1))
        except ValueError as e:
            raise OpenEnvError(f"the observation's task_prompt is not a list of chat messages: {e}") from None
        out.append({"role": m["role"], "content": text})
        left, cut = left - len(text), cut + n
    return out, cut
