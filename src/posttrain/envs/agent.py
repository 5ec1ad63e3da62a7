"""Train any agent written against the `openai` client: AgentEnv turns `async def agent(client, row)` into an Env.

    async def agent(client: openai.AsyncOpenAI, row: dict) -> float | dict | str | None:
        r = await client.chat.completions.create(model="policy", messages=[...])
        ...
        return reward

For each rollout, AgentEnv serves the sampler it is given as an OpenAI-compatible endpoint on 127.0.0.1 (one
in-process server per sampler and event loop, on a free port, started on first use), hands the agent a client
whose requests carry a fresh `X-Rollout-Id`, runs the agent under a timeout, and builds the Trajectory from
the calls the server recorded: exact prompt ids, completion ids and sampler logprobs, never re-tokenized text.

What the agent returns sets the reward:
  * a number: the reward (`passed` when it reaches `pass_threshold`);
  * a dict: `reward` (required), optional `passed`, and any other numeric values as reward components;
  * a string: the agent's final answer, scored in `score()` by the task's rubric (as SingleTurnEnv scores a
    completion);
  * None: the text of the last model reply is scored by the task's rubric.

A multi-call agent gives one trajectory when each call continues the previous conversation (the server splices
the sampled tokens into the next prompt). If the agent rewrites history, the calls split into several chains
and the chain with the most sampled tokens is trained on; the others are counted in `stats["dropped_calls"]`
(see sampling/recorder.py). An agent that raises or times out gives a failed trajectory (counted, logged, kept
out of training), it does not stop the run.
"""

from __future__ import annotations

import asyncio
import logging
import math
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from posttrain.envs.task import Task
from posttrain.sampling.base import Sampler
from posttrain.sampling.http_serve import InLoopServer
from posttrain.sampling.openai_server import create_app
from posttrain.types import SampleParams, Trajectory, Turn

log = logging.getLogger(__name__)
AgentFn = Callable[[Any, dict[str, Any]], Awaitable[Any]]


NEEDS_RUBRIC = "agent_needs_rubric"  # Trajectory.extra mark (this env's own): the agent returned an answer to score


class AgentEnv:
    def __init__(
        self,
        agent_fn: AgentFn,
        task: Task | None = None,
        tokenizer: Any = None,
        timeout_s: float = 300.0,
        request_timeout_s: float = 120.0,
        model_name: str = "policy",
        max_tokens: int | None = None,
        pass_threshold: float = 1.0,
        host: str = "127.0.0.1",
    ):
        """`tokenizer` defaults to the sampler's (`sampler.tokenizer`); the server needs it for chat templates.
        `timeout_s` bounds one whole agent run, `request_timeout_s` one model call. `max_tokens` is the
        server's default when a request sets none (else the task's hint, else 512)."""
        self.agent_fn = agent_fn
        self.task = task
        self.tokenizer = tokenizer
        self.timeout_s = timeout_s
        self.request_timeout_s = request_timeout_s
        self.model_name = model_name
        self.max_tokens = max_tokens or (task.max_tokens if task else None) or 512
        self.pass_threshold = pass_threshold
        self.host = host
        self.stats = {"rollouts": 0, "failed": 0, "timeouts": 0, "dropped_calls": 0}
        # One server per (event loop, sampler): [(loop, sampler, the start's future -> (InLoopServer, app))]. A
        # handful at most, compared by identity: a loop and a sampler are the very objects served.
        self._servers: list[tuple[Any, Any, asyncio.Future]] = []

    # ---- the server --------------------------------------------------------------------------------------
    async def server_for(self, sampler: Sampler) -> tuple[InLoopServer, Any]:
        """The (started) server and app serving `sampler` in the running loop. Concurrent first calls share one
        start (the entry is a task, stored before anything is awaited)."""
        loop = asyncio.get_running_loop()
        entry = next((e for lp, sp, e in self._servers if lp is loop and sp is sampler), None)
        if entry is not None and entry.done() and _started(entry) is None:
            entry = None  # failed to start, or stopped: start again
        if entry is None:
            tok = self.tokenizer or getattr(sampler, "tokenizer", None)
            if tok is None:
                raise ValueError("AgentEnv needs the policy's tokenizer: pass tokenizer=... (the sampler has none)")
            app = create_app(
                sampler,
                tok,
                model_name=self.model_name,
                request_timeout_s=self.request_timeout_s,
                default_max_tokens=self.max_tokens,
            )
            entry = asyncio.ensure_future(self._start(app))
            self._servers = [
                (lp, sp, e)
                for lp, sp, e in self._servers
                if not (lp is loop and sp is sampler) and (not e.done() or _started(e) is not None)
            ]
            self._servers.append((loop, sampler, entry))
        return await asyncio.shield(entry)

    async def _start(self, app: Any) -> tuple[InLoopServer, Any]:
        srv = await InLoopServer(app, self.host, 0).start()
        log.info("serving the policy for agents at %s/v1", srv.url)
        return srv, app

    async def close(self) -> None:
        loop = asyncio.get_running_loop()
        for _, _, entry in self._servers:
            srv = _started(entry) if entry.done() else None
            if srv is not None and srv.loop is loop:
                await srv.stop()
        self._servers.clear()

    # ---- Env protocol ------------------------------------------------------------------------------------
    async def rollout(self, row: dict[str, Any], sampler: Sampler, params: SampleParams | None = None) -> Trajectory:
        """One agent run. The agent's own requests choose how to sample, so `params` (part of the Env
        protocol) is not used here."""
        import openai

        srv, app = await self.server_for(sampler)
        rid = uuid.uuid4().hex
        client = openai.AsyncOpenAI(
            base_url=srv.url + "/v1",
            api_key="x",
            default_headers={"X-Rollout-Id": rid},
            timeout=self.request_timeout_s,
            max_retries=0,
        )
        result, error = None, None
        try:
            result = await asyncio.wait_for(self.agent_fn(client, row), self.timeout_s)
        except TimeoutError:
            self.stats["timeouts"] += 1
            error = f"agent timed out after {self.timeout_s}s"
        except Exception as e:  # noqa: BLE001 - a broken agent run is a failed sample, not a dead training run
            error = f"agent raised {type(e).__name__}: {e}"
        finally:
            await client.close()
            record = app.state.recorder.pop(rid)
        self.stats["rollouts"] += 1
        traj = record.trajectory(row)
        if traj is None:
            traj = Trajectory(turns=[Turn([], [], [], sampler.policy_version)], row=dict(row))
            error = error or "agent made no model calls"
        self.stats["dropped_calls"] += record.dropped_calls
        traj.metrics.update(
            {"agent/calls": float(len(record.calls)), "agent/dropped_calls": float(record.dropped_calls)}
        )
        if error is None:
            error = self._apply_result(traj, result)
        if error is not None:
            self.stats["failed"] += 1
            log.warning("agent rollout failed: %s", error)
            traj.failed, traj.error, traj.reward, traj.passed = True, error, 0.0, False
        return traj

    async def score(self, trajectories: list[Trajectory]) -> None:
        """Score the trajectories whose agent returned a final answer (or None) with the task's rubric; the
        others already carry the agent's reward."""
        mine = [t for t in trajectories if t.extra.get(NEEDS_RUBRIC)]
        todo = [t for t in mine if not t.failed]
        scored = False
        try:
            if todo:
                task = self.task
                assert task is not None  # _apply_result marks NEEDS_RUBRIC only when there is a task
                conv = task.conversational
                completions = [
                    [{"role": "assistant", "content": t.completion_text}] if conv else t.completion_text for t in todo
                ]
                rows = [{k: v for k, v in t.row.items() if k != "prompt"} for t in todo]
                scores = await asyncio.to_thread(
                    task.rubric.score,
                    completions,
                    rows,
                    prompts=[t.row.get("prompt") for t in todo],
                    completion_ids=[t.completion_ids for t in todo],
                )
                for t, s in zip(todo, scores, strict=True):
                    t.reward, t.reward_components, t.passed, t.failed, t.error = (
                        s.reward,
                        s.components,
                        s.passed,
                        s.failed,
                        s.error,
                    )
            scored = True
        finally:
            # A batch that raised is scored again one sample at a time (envs/isolate.py): keep its entries for
            # that; a sample whose own scoring raised is done with (it fails).
            if scored or len(mine) <= 1:
                for t in mine:
                    t.extra.pop(NEEDS_RUBRIC, None)

    def _apply_result(self, traj: Trajectory, result: Any) -> str | None:
        """Set the reward from what the agent returned; an error message when it cannot be used."""
        if isinstance(result, (bool, int, float)):
            reward = float(result)
            if not math.isfinite(reward):
                return f"agent returned a non-finite reward {result!r}"
            traj.reward, traj.passed = reward, reward >= self.pass_threshold
            return None
        if isinstance(result, dict):
            if "reward" not in result:
                return f"agent returned a dict without 'reward': {sorted(result)}"
            try:
                traj.reward = float(result["reward"])
                traj.reward_components = {
                    k: float(v)
                    for k, v in result.items()
                    if k not in ("reward", "passed") and isinstance(v, (int, float))
                }
            except (TypeError, ValueError) as e:
                return f"agent returned a non-numeric reward: {e}"
            traj.passed = bool(result.get("passed", traj.reward >= self.pass_threshold))
            return None
        if result is None or isinstance(result, str):
            if self.task is None:
                return "agent returned no reward and AgentEnv has no task rubric to score its answer"
            if isinstance(result, str):
                traj.completion_text = result
            traj.extra[NEEDS_RUBRIC] = True
            return None
        return f"agent must return a number, a dict, a string or None, got {type(result).__name__}"


def _started(entry: asyncio.Future) -> InLoopServer | None:
    """The running server of a finished start, or None if the start failed or the server has stopped."""
    if entry.cancelled() or entry.exception() is not None:
        return None
    srv = entry.result()[0]
    return srv if srv.task is not None and not srv.task.done() else None
