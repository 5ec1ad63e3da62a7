"""Train any agent written against the `openai` client: AgentEnv turns `agent(client, row)` into an Env.

    async def agent(client: openai.AsyncOpenAI, row: dict) -> float | dict | str | None:
        r = await client.chat.completions.create(model="policy", messages=[...])
        ...
        return reward

    def agent(client: openai.OpenAI, row: dict) -> ...:      # a sync framework: run in a thread of its own
        r = client.chat.completions.create(model="policy", messages=[...])

For each rollout, AgentEnv serves the sampler it is given as an OpenAI-compatible endpoint on 127.0.0.1 (one
in-process server per sampler and event loop, on a free port, started on first use), hands the agent a client
whose requests carry a fresh `X-Rollout-Id`, runs the agent under a timeout, and builds the Trajectory from
the calls the server recorded: exact prompt ids, completion ids and sampler logprobs, never re-tokenized text. An
`async def` agent runs on the event loop; a plain function runs in a worker thread with a blocking client, so it
cannot freeze the endpoint served in this loop (envs/agent_runner.py).

The run's sampling settings (the rollout's `params`: temperature, top_p, top_k, max_tokens) are the defaults of the
agent's requests: a request that sets none is sampled as the trainer scores it. A request that sets another
temperature keeps it, is counted (`agent/temperature_overrides`) and said once in the console.

What the agent returns sets the reward:
  * a number: the reward (`passed` when it reaches `pass_threshold`);
  * a dict: `reward` (required), optional `passed`, and any other numeric values as reward components;
  * a string: the agent's final answer, scored in `score()` by the task's rubric (as SingleTurnEnv scores a
    completion);
  * None: the text of the last model reply is scored by the task's rubric.

A multi-call agent gives one chain of turns when each call continues the previous conversation (the server
splices the sampled tokens into the next prompt). An agent that rewrites its history (summarises it, rebuilds it as
text, leaves a reply out) breaks its calls into several chains (sampling/recorder.py). `chains="all"` (default)
trains every chain as a sequence of its own, each with the episode's reward and advantage (Trajectory.extra_chains;
loop/batch.py counts the episode once in its group's statistics and weighs it as one sequence in the loss);
`chains="longest"` trains only the chain with the most sampled tokens and counts the other calls in
`agent/dropped_calls`. Either is said once in the console. An agent that raises or times out gives a failed
trajectory (counted, logged, kept out of training), it does not stop the run.
"""

from __future__ import annotations

import asyncio
import logging
import math
import uuid
from collections.abc import Callable
from typing import Any

from posttrain.envs.agent_runner import SyncAgents, is_async_agent
from posttrain.envs.task import Task
from posttrain.sampling.base import Sampler
from posttrain.sampling.http_serve import InLoopServer
from posttrain.sampling.openai_server import create_app
from posttrain.sampling.recorder import CHAIN_MODES, RolloutDefaults, RolloutRecord
from posttrain.types import SampleParams, Trajectory, Turn

log = logging.getLogger(__name__)
# async def agent(client: openai.AsyncOpenAI, row), or def agent(client: openai.OpenAI, row)
AgentFn = Callable[[Any, dict[str, Any]], Any]


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
        chains: str = "all",
    ):
        """`agent_fn`: `async def agent(client, row)` or a plain `def agent(client, row)` (run in a thread with a
        blocking `openai.OpenAI` client). `tokenizer` defaults to the sampler's (`sampler.tokenizer`); the server
        needs it for chat templates. `timeout_s` bounds one whole agent run, `request_timeout_s` one model call.
        `max_tokens` is the default of a request that sets none (else the run's `params.max_tokens`, else the
        task's hint, else 512). `chains`: "all" trains every chain of calls, "longest" only the longest (see the
        module docstring)."""
        if chains not in CHAIN_MODES:
            raise ValueError(f"AgentEnv(chains=...) must be one of {CHAIN_MODES}, got {chains!r}")
        self.agent_fn = agent_fn
        self.is_async = is_async_agent(agent_fn)
        self.sync_agents = SyncAgents()  # a plain agent's threads, and how many still run past their timeout
        self.task = task
        self.tokenizer = tokenizer
        self.timeout_s = timeout_s
        self.request_timeout_s = request_timeout_s
        self.model_name = model_name
        self.max_tokens = max_tokens
        self.pass_threshold = pass_threshold
        self.host = host
        self.chains = chains
        self.stats = {
            "rollouts": 0,
            "failed": 0,
            "timeouts": 0,
            "dropped_calls": 0,  # calls left out of training (chains="longest")
            "split_episodes": 0,  # episodes whose calls formed more than one chain
            "temperature_overrides": 0,  # requests that set a temperature other than the run's
        }
        self._said: set[str] = set()  # what the console was told once: "split", "temperature"
        # One server per (event loop, sampler, default max_tokens): [(loop, sampler, max_tokens, the start's future
        # -> (InLoopServer, app))]. A handful at most, compared by identity: a loop and a sampler are the very
        # objects served. (A chat request's max_tokens default is the server's: cut to fit the context.)
        self._servers: list[tuple[Any, Any, int, asyncio.Future]] = []

    def default_max_tokens(self, params: SampleParams | None) -> int:
        """A request's max_tokens where it sets none: the env's, else the run's, else the task's hint, else 512."""
        hint = self.task.max_tokens if self.task is not None else None
        return self.max_tokens or (params.max_tokens if params is not None else None) or hint or 512

    # ---- the server --------------------------------------------------------------------------------------
    async def server_for(self, sampler: Sampler, max_tokens: int | None = None) -> tuple[InLoopServer, Any]:
        """The (started) server and app serving `sampler` in the running loop, with `max_tokens` as its default
        (None: `default_max_tokens(None)`). Concurrent first calls share one start (the entry is a task, stored
        before anything is awaited)."""
        loop = asyncio.get_running_loop()
        max_tokens = max_tokens or self.default_max_tokens(None)
        entry = next((e for lp, sp, mt, e in self._servers if lp is loop and sp is sampler and mt == max_tokens), None)
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
                default_max_tokens=max_tokens,
                tool_parser=getattr(self.task, "tool_parser", "auto"),  # sampling/reply_parsers.py
                reasoning_parser=getattr(self.task, "reasoning_parser", "auto"),
            )
            entry = asyncio.ensure_future(self._start(app))
            self._servers = [
                (lp, sp, mt, e)
                for lp, sp, mt, e in self._servers
                if not (lp is loop and sp is sampler and mt == max_tokens) and (not e.done() or _started(e) is not None)
            ]
            self._servers.append((loop, sampler, max_tokens, entry))
        return await asyncio.shield(entry)

    async def _start(self, app: Any) -> tuple[InLoopServer, Any]:
        srv = await InLoopServer(app, self.host, 0).start()
        log.info("serving the policy for agents at %s/v1", srv.url)
        return srv, app

    async def close(self) -> None:
        loop = asyncio.get_running_loop()
        for _, _, _, entry in self._servers:
            srv = _started(entry) if entry.done() else None
            if srv is not None and srv.loop is loop:
                await srv.stop()
        self._servers.clear()

    # ---- Env protocol ------------------------------------------------------------------------------------
    async def rollout(self, row: dict[str, Any], sampler: Sampler, params: SampleParams | None = None) -> Trajectory:
        """One agent run. `params` (the run's sampling settings) are the defaults of the agent's requests."""
        import openai

        max_tokens = self.default_max_tokens(params)
        srv, app = await self.server_for(sampler, max_tokens)
        rid = uuid.uuid4().hex
        app.state.recorder.set_defaults(rid, _defaults(params, max_tokens))
        result, error = None, None
        try:
            if self.is_async:
                client = self._client(openai.AsyncOpenAI, srv.url, rid)
                try:
                    result = await asyncio.wait_for(self.agent_fn(client, row), self.timeout_s)
                finally:
                    await client.close()
            else:
                client = self._client(openai.OpenAI, srv.url, rid)
                result = await self.sync_agents.run(self.agent_fn, client, row, self.timeout_s)
        except TimeoutError:
            self.stats["timeouts"] += 1
            error = f"agent timed out after {self.timeout_s}s"
        except Exception as e:  # noqa: BLE001 - a broken agent run is a failed sample, not a dead training run
            error = f"agent raised {type(e).__name__}: {e}"
        finally:
            record = app.state.recorder.pop(rid)
        self.stats["rollouts"] += 1
        traj = record.episode(row, self.chains)
        if traj is None:
            traj = Trajectory(turns=[Turn([], [], [], sampler.policy_version)], row=dict(row))
            error = error or "agent made no model calls"
        self._count(traj, record, params)
        if error is None:
            error = self._apply_result(traj, result)
        if error is not None:
            self.stats["failed"] += 1
            log.warning("agent rollout failed: %s", error)
            traj.failed, traj.error, traj.reward, traj.passed = True, error, 0.0, False
        return traj

    def _client(self, cls: Any, url: str, rid: str) -> Any:
        """An `openai` client of the policy's endpoint whose requests carry the rollout id; one try per call, each
        bounded by request_timeout_s."""
        return cls(
            base_url=url + "/v1",
            api_key="x",
            default_headers={"X-Rollout-Id": rid},
            timeout=self.request_timeout_s,
            max_retries=0,
        )

    def _count(self, traj: Trajectory, record: RolloutRecord, params: SampleParams | None) -> None:
        """The episode's call metrics, and what the console is told once: calls split or dropped, a temperature
        other than the run's."""
        n_calls, n_chains = len(record.calls), len(record.chains())
        dropped = record.dropped_calls if self.chains == "longest" else 0
        self.stats["dropped_calls"] += dropped
        self.stats["split_episodes"] += int(n_chains > 1)
        self.stats["temperature_overrides"] += record.temperature_overrides
        traj.metrics.update(
            {
                "agent/calls": float(n_calls),
                "agent/chains": float(n_chains),
                "agent/dropped_calls": float(dropped),
                "agent/temperature_overrides": float(record.temperature_overrides),
            }
        )
        if n_chains > 1 and "split" not in self._said:
            self._said.add("split")
            if dropped:
                log.warning(
                    "agent calls did not extend one another (the agent rewrote its history): %d of an episode's %d "
                    "calls were dropped from training, only its longest chain is trained; AgentEnv(chains='all') "
                    "trains every call (episode/agent/dropped_calls counts them)",
                    dropped,
                    n_calls,
                )
            else:
                log.warning(
                    "agent calls did not extend one another (the agent rewrote its history): an episode of %d calls "
                    "is trained as %d chains, each a sequence with the episode's reward and advantage "
                    "(episode/agent/chains; AgentEnv(chains='longest') trains only the longest)",
                    n_calls,
                    n_chains,
                )
        if record.temperature_overrides and params is not None and "temperature" not in self._said:
            self._said.add("temperature")
            log.warning(
                "an agent request set temperature=%s but the run samples at %s (sampling.temperature), the temperature "
                "the trainer scores at: those tokens train off-policy (episode/agent/temperature_overrides counts "
                "them). Fix: leave temperature out of the agent's requests (the run's is their default), or set "
                "sampling.temperature=%s",
                record.asked_temperature,
                params.temperature,
                record.asked_temperature,
            )

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


def _defaults(params: SampleParams | None, max_tokens: int) -> RolloutDefaults:
    """The run's sampling settings as the defaults of a rollout's requests (its stop strings are the task's prompts',
    not an agent's: left out). No params: the server's own, but the env's max_tokens."""
    if params is None:
        return RolloutDefaults(max_tokens=max_tokens)
    return RolloutDefaults(params.temperature, params.top_p, params.top_k, max_tokens)


def _started(entry: asyncio.Future) -> InLoopServer | None:
    """The running server of a finished start, or None if the start failed or the server has stopped."""
    if entry.cancelled() or entry.exception() is not None:
        return None
    srv = entry.result()[0]
    return srv if srv.task is not None and not srv.task.done() else None
