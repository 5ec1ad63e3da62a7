"""Serve any posttrain Env (or Task) over the OpenEnv protocol, so OpenEnv clients can play it.

The protocol (openenv-core 0.3, `openenv.core.env_server.http_server`):
    WS   /ws        a session: {"type": "reset", "data": {...}} | {"type": "step", "data": ACTION} | {"type": "state"}
                    | {"type": "close"}; answers {"type": "observation", "data": {"observation", "reward", "done"}},
                    {"type": "state", "data": {...}} or {"type": "error", "data": {"message", "code"}}
    POST /reset     {"seed"?, "episode_id"?, ...} -> {"observation", "reward", "done"}   (stateless, as in OpenEnv)
    POST /step      {"action": ACTION, ...} -> {"observation", "reward", "done"}           (stateless, see below)
    GET  /state /health /metadata /schema

A posttrain Env drives the model itself (`await env.rollout(row, sampler)`). Here the roles are inverted: the
session hands the env a sampler whose `sample()` sends the prompt to the client as an observation and waits
for the client's next action `{"message": text}`; the text is tokenized and returned as the completion. When
the rollout ends, the env scores it and the last observation carries the reward with `done: true`.

Observations: `{"prompt": <the model's full context as text, special tokens included>, "task_prompt": <the
row's prompt, on the first observation>, "turn": k}`; the final one adds `completion`, `reward_components`,
`passed` and `error`. `reset` picks the row: `index` (or `seed`) modulo the number of rows, else round robin;
`split` is "train" (default) or "eval". HTTP `/step` is a one-shot episode (OpenEnv's HTTP routes keep no
state): a fresh episode on the row chosen by the request's `index`/`seed`, with the action as the first reply;
for single-turn tasks that is the whole episode. Each session waits at most `action_timeout_s` for an action.

Limits: an action's text is at most `max_action_chars` characters (longer: an error reply, or 422 over HTTP) and
is tokenized in a worker thread, off the event loop; a message on /ws is at most the server's WebSocket cap
(http_serve.HttpGuard.ws_max_bytes, 1 MiB: close code 1009 past it) and its JSON is parsed with
posttrain.bounded's caps; `index` / `seed` must be integers and `split` "train" or "eval" (else an error reply,
or 422 over HTTP). Body size, header and body timeouts and the API key are the HTTP server's (http_serve).
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request, WebSocket, WebSocketDisconnect
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict

from posttrain.bounded import BoundedError, loads_json
from posttrain.envs.scoring import scored
from posttrain.sampling.http_serve import schema_error_message
from posttrain.types import Completion, SampleParams, Trajectory

log = logging.getLogger(__name__)


class StepBody(BaseModel):
    model_config = ConfigDict(extra="allow")
    action: dict[str, Any]
    timeout_s: float | None = None
    request_id: str | None = None


class EnvSession:
    """One episode of `env` played by a remote client. It is the Sampler the env calls."""

    def __init__(
        self, env: Any, tokenizer: Any, row: dict[str, Any], action_timeout_s: float, max_action_chars: int = 200_000
    ):
        self.env, self.tok, self.row = env, tokenizer, row
        self.action_timeout_s = action_timeout_s
        self.max_action_chars = max_action_chars
        self.episode_id = uuid.uuid4().hex
        self.policy_version = 0
        self.step_count = 0
        self.done = False
        self._obs: asyncio.Queue = asyncio.Queue()
        self._actions: asyncio.Queue = asyncio.Queue()
        self._task: asyncio.Task | None = None

    def decode(self, token_ids: list[int]) -> str:
        return self.tok.decode(token_ids, skip_special_tokens=True)

    async def sample(self, prompts_P: list[list[int]], params: SampleParams, n: int = 1) -> list[list[Completion]]:
        out = []
        for p in prompts_P:
            group = []
            for _ in range(n):
                obs = {"prompt": self.tok.decode(p, skip_special_tokens=False), "turn": self.step_count}
                if self.step_count == 0:
                    obs["task_prompt"] = self.row.get("prompt")
                await self._obs.put({"observation": obs, "reward": None, "done": False})
                text = await asyncio.wait_for(self._actions.get(), self.action_timeout_s)
                ids = await asyncio.to_thread(self._encode, text)  # off the loop: other sessions go on
                group.append(Completion(ids, [0.0] * len(ids), "stop", self.policy_version, text=text))
            out.append(group)
        return out

    def _encode(self, text: str) -> list[int]:
        return [int(i) for i in self.tok(text, add_special_tokens=False)["input_ids"]]

    async def _run(self) -> None:
        try:
            rolled: Trajectory = await self.env.rollout(self.row, self)
            (score,) = await self.env.score([rolled])
            traj = scored(rolled, score)
            final = {
                "prompt": "",
                "turn": self.step_count,
                "completion": traj.completion_text,
                "reward_components": traj.reward_components,
                "passed": traj.passed,
                "error": traj.error,
            }
            await self._obs.put({"observation": final, "reward": traj.reward, "done": True})
        except Exception as e:  # noqa: BLE001 - report to the client, as an error message, and end the episode
            await self._obs.put(e)

    async def _next(self) -> dict[str, Any]:
        item = await asyncio.wait_for(self._obs.get(), self.action_timeout_s)
        if isinstance(item, Exception):
            self.done = True
            raise RuntimeError(f"env failed: {type(item).__name__}: {item}")
        self.done = bool(item["done"])
        return item

    async def reset(self) -> dict[str, Any]:
        self._task = asyncio.create_task(self._run())
        return await self._next()

    async def step(self, action: dict[str, Any]) -> dict[str, Any]:
        if self._task is None:
            raise RuntimeError("call reset before step")
        if self.done:
            raise RuntimeError("the episode is done; call reset")
        if not isinstance(action, dict):
            raise ValueError(f"action must be {{'message': str}}, got {type(action).__name__}")
        text = action.get("message")
        if not isinstance(text, str):
            raise ValueError(f"action must be {{'message': str}}, got {json.dumps(action, default=str)[:200]}")
        if len(text) > self.max_action_chars:
            raise ValueError(
                f"the action's message has {len(text)} characters; this server takes at most {self.max_action_chars}"
            )
        self.step_count += 1
        await self._actions.put(text)
        return await self._next()

    def state(self) -> dict[str, Any]:
        return {"episode_id": self.episode_id, "step_count": self.step_count, "done": self.done}

    def close(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()


class RowPicker:
    def __init__(self, train_rows: list[dict[str, Any]], eval_rows: list[dict[str, Any]]):
        self.rows = {"train": train_rows, "eval": eval_rows or train_rows}
        self._next = 0

    def pick(self, data: dict[str, Any]) -> dict[str, Any]:
        """The row `data` names (ValueError for a choice that names none)."""
        if not isinstance(data, dict):
            raise ValueError(f"reset data must be an object, got {type(data).__name__}")
        split = data.get("split", "train")
        rows = self.rows.get(split) if isinstance(split, str) else None
        if rows is None:
            raise ValueError(f"split must be 'train' or 'eval', got {str(split)[:50]!r}")
        key = data.get("index", data.get("seed"))
        if key is None:
            key, self._next = self._next, self._next + 1
        return rows[_row_index(key) % len(rows)]


def _row_index(key: Any) -> int:
    """`index` / `seed` as an int: an integer, or a string or float that is one (as int() reads them)."""
    if isinstance(key, bool) or not isinstance(key, (int, float, str)):
        raise ValueError(f"index and seed must be integers, got {type(key).__name__}")
    try:
        return int(key)
    except (ValueError, OverflowError):
        raise ValueError(f"index and seed must be integers, got {str(key)[:50]!r}") from None


def create_env_app(
    env: Any,
    tokenizer: Any,
    train_rows: list[dict[str, Any]],
    eval_rows: list[dict[str, Any]] | None = None,
    name: str = "posttrain-env",
    description: str = "",
    action_timeout_s: float = 600.0,
    max_action_chars: int = 200_000,
) -> FastAPI:
    """`max_action_chars`: the most characters an action's message may have."""
    picker = RowPicker(train_rows, eval_rows or [])
    app = FastAPI(title=f"{name} (OpenEnv protocol)")

    @app.exception_handler(RequestValidationError)
    async def _schema(_: Request, e: RequestValidationError) -> JSONResponse:  # the values are not echoed back
        return JSONResponse(status_code=422, content={"detail": schema_error_message(e)[0]})

    def new_session(data: dict[str, Any]) -> EnvSession:
        return EnvSession(env, tokenizer, picker.pick(data), action_timeout_s, max_action_chars)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "healthy"}

    @app.get("/metadata")
    async def metadata() -> dict[str, Any]:
        return {
            "name": name,
            "description": description or f"posttrain env {name}",
            "version": "1.0.0",
            "readme_content": None,
            "author": None,
            "documentation_url": None,
        }

    @app.get("/schema")
    async def schema() -> dict[str, Any]:
        obj = {"type": "object"}
        return {
            "action": {**obj, "properties": {"message": {"type": "string"}}, "required": ["message"]},
            "observation": {**obj, "properties": {"prompt": {"type": "string"}, "turn": {"type": "integer"}}},
            "state": {**obj, "properties": {"episode_id": {"type": "string"}, "step_count": {"type": "integer"}}},
        }

    @app.get("/state")
    async def state() -> dict[str, Any]:
        return {"episode_id": None, "step_count": 0}

    @app.post("/reset")
    async def reset(data: dict[str, Any] | None = None) -> Any:
        return await _one_shot(lambda: new_session(data or {}), None)

    @app.post("/step")
    async def step(body: StepBody) -> Any:
        return await _one_shot(lambda: new_session(body.model_extra or {}), body.action)

    @app.websocket("/ws")
    async def ws(websocket: WebSocket) -> None:
        await websocket.accept()
        session: EnvSession | None = None
        try:
            while True:
                frame = await websocket.receive()
                if frame["type"] == "websocket.disconnect":
                    break
                raw = frame.get("text")
                if raw is None:  # a binary frame: read as UTF-8 text
                    raw = (frame.get("bytes") or b"").decode("utf-8", errors="replace")
                try:
                    msg = loads_json(raw)  # a client's message: size and depth capped (deep nesting recursed)
                    kind = msg.get("type")
                    if kind == "reset":
                        if session is not None:
                            session.close()
                        session = new_session(msg.get("data") or {})
                        reply = {"type": "observation", "data": await session.reset()}
                    elif kind == "step":
                        if session is None:
                            raise RuntimeError("call reset before step")
                        reply = {"type": "observation", "data": await session.step(msg.get("data") or {})}
                    elif kind == "state":
                        reply = {
                            "type": "state",
                            "data": session.state() if session else {"episode_id": None, "step_count": 0},
                        }
                    elif kind == "close":
                        break
                    else:
                        reply = _ws_error(f"Unknown message type: {kind}", "UNKNOWN_TYPE")
                except BoundedError as e:
                    reply = _ws_error(f"Invalid JSON: {e}", "INVALID_JSON")
                except (ValueError, AttributeError) as e:
                    reply = _ws_error(str(e), "VALIDATION_ERROR")
                except TimeoutError:
                    reply = _ws_error(f"no observation within {action_timeout_s}s", "EXECUTION_ERROR")
                except Exception as e:  # noqa: BLE001 - one bad message must not end the server
                    reply = _ws_error(str(e), "EXECUTION_ERROR")
                await websocket.send_text(json.dumps(reply, default=str))
        except WebSocketDisconnect:
            pass
        finally:
            if session is not None:
                session.close()

    return app


async def _one_shot(make_session: Callable[[], EnvSession], action: dict[str, Any] | None) -> Any:
    """One HTTP episode: 422 for a request that names no row or holds a bad action, 504 when the env took too
    long, 500 when the env failed."""
    session: EnvSession | None = None
    try:
        session = make_session()
        out = await session.reset()
        if action is not None and not out["done"]:
            out = await session.step(action)
        return out
    except ValueError as e:
        return JSONResponse(status_code=422, content={"detail": str(e)})
    except TimeoutError:
        return JSONResponse(status_code=504, content={"detail": "the environment did not answer in time"})
    except RuntimeError as e:
        return JSONResponse(status_code=500, content={"detail": str(e) or type(e).__name__})
    finally:
        if session is not None:
            session.close()


def _ws_error(message: str, code: str) -> dict[str, Any]:
    return {"type": "error", "data": {"message": message, "code": code}}


def create_task_app(task: Any, tokenizer: Any, params: SampleParams | None = None, **kwargs: Any) -> FastAPI:
    """A Task served as a single-turn OpenEnv environment: reset -> the prompt, step({"message": answer}) ->
    the rubric's reward, done."""
    from posttrain.envs.single_turn import SingleTurnEnv

    env = SingleTurnEnv(task, tokenizer, params or SampleParams(max_tokens=task.max_tokens or 512))
    return create_env_app(
        env, tokenizer, task.train_rows, task.eval_rows, name=task.name, description=task.description, **kwargs
    )
