"""Train any agent written against the `openai` client: AgentEnv turns `agent(client, row)` into an Env.

    async def agent(client: openai.AsyncOpenAI, row: dict) -> float | dict | str | None:
        r = await client.chat.completions.create(model="policy", messages=[...])
        ...
        return reward

    def agent(client: openai.OpenAI, row: dict) -> ...:      # a sync framework: run in a thread of its own
        r = client.chat.completions.create(model="policy", messages=[...])

For each rollout, AgentEnv serves the sampler it is given as an OpenAI-compatible endpoint on 127.0.0.1 (one
in-process server per sampler and event loop, on a free port, started on first use), hands the agent a client
whose base URL is the rollout's own (`.../rollouts/<id>/v1`: a framework pointed at `str(client.base_url)` is
recorded under the episode too) and whose requests carry the id as `X-Rollout-Id`, runs the agent under a timeout,
and builds the Trajectory from
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
`agent/dropped_calls`. Either is said once in the console.

Thinking models (`thinking`, default the task's `Task.thinking`, "split"): the chat template is checked once, with
a conversation holding reasoning and tool calls (models/template_check.py). "split": where the template drops a
reply's reasoning from the next conversation (DeepSeek-R1, Qwen3 before the last query), the next call is rendered
as the template renders it, a new chain (chat_prompt.py): every trained context is one the model was given.
"keep": the server renders with a variant of the template that keeps every turn's reasoning (refused at the check
when there is none), and an agent that sends back each reply's `reasoning_content` gets one chain.

An agent that raises or times out gives a failed trajectory (counted, logged, kept out of training), it does not
stop the run.
"""

from __future__ import annotations

import asyncio
import logging
import math
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from posttrain.envs.agent_runner import SyncAgents, is_async_agent
from posttrain.envs.scoring import failed, score_of
from posttrain.envs.task import Task
from posttrain.models.template_check import THINKING_MODES, check_multi_turn_template
from posttrain.rewards.rubric import Score
from posttrain.sampling.base import Sampler
from posttrain.sampling.chat_prompt import ChatRenderer
from posttrain.sampling.http_serve import InLoopServer
from posttrain.sampling.openai_server import create_app
from posttrain.sampling.recorder import CHAIN_MODES, RolloutDefaults, RolloutRecord
from posttrain.sampling.reply_parsers import ReplyParsers
from posttrain.sampling.rollout_paths import rollout_base_url
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
        *,
        tokenizer: Any,
        timeout_s: float = 300.0,
        request_timeout_s: float = 120.0,
        model_name: str = "policy",
        max_tokens: int | None = None,
        pass_threshold: float = 1.0,
        host: str = "127.0.0.1",
        chains: str = "all",
        thinking: str | None = None,
    ):
        """`agent_fn`: `async def agent(client, row)` or a plain `def agent(client, row)` (run in a thread with a
        blocking `openai.OpenAI` client). `tokenizer`: the policy's (an env_factory is given it); the server
        renders chat templates with it (the Sampler protocol has none to borrow). `timeout_s` bounds one whole
        agent run, `request_timeout_s` one model call. `max_tokens` is the default of a request that sets none
        (else the run's `params.max_tokens`, else the task's hint, else 512). `chains`: "all" trains every chain
        of calls, "longest" only the longest (see the module docstring)."""
        self.thinking = thinking or (task.thinking if task is not None else "split")  # Task.thinking; module docstring
        # How replies are read (sampling/reply_parsers.py): the task's families, else read from the chat template
        self.tool_parser = task.tool_parser if task is not None else "auto"
        self.reasoning_parser = task.reasoning_parser if task is not None else "auto"
        if self.thinking not in THINKING_MODES:
            raise ValueError(f"AgentEnv(thinking=...) must be one of {THINKING_MODES}, got {self.thinking!r}")
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
        self.chat_template(tokenizer)  # refused here, before any rollout, if the template would mistrain
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
            tok = self.tokenizer
            template = self.chat_template(tok)
            app = create_app(
                sampler,
                tok,
                model_name=self.model_name,
                request_timeout_s=self.request_timeout_s,
                default_max_tokens=max_tokens,
                tool_parser=self.tool_parser,
                reasoning_parser=self.reasoning_parser,
            )
            if template is not None:  # thinking: keep: the server renders with the template that keeps reasoning
                app.state.posttrain.renderer = ChatRenderer(tok, template, keep_reasoning=True)
            entry = asyncio.ensure_future(self._start(app))
            self._servers = [
                (lp, sp, mt, e)
                for lp, sp, mt, e in self._servers
                if not (lp is loop and sp is sampler and mt == max_tokens) and (not e.done() or _started(e) is not None)
            ]
            self._servers.append((loop, sampler, max_tokens, entry))
        return await asyncio.shield(entry)

    def chat_template(self, tok: Any) -> str | None:
        """The multi-turn template check (models/template_check.py `check_multi_turn_template`; once per tokenizer
        and mode): the token prefix check, or for a thinking model's template the split/keep check. None (the
        tokenizer's own template) or, under thinking="keep", the variant that keeps every turn's reasoning. Raises
        ChatTemplateError (a PosttrainError with its fix) for a template that would train on contexts the model
        never sees."""
        fmt = ReplyParsers(tok, "auto", self.reasoning_parser).reasoning
        return check_multi_turn_template(tok, self.thinking, "tool", fmt.start, fmt.end)

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
        result, error, timed_out = None, None, False
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
            timed_out = True
            error = f"agent timed out after {self.timeout_s}s"
        except Exception as e:  # noqa: BLE001 - a broken agent run is a failed sample, not a dead training run
            error = f"agent raised {type(e).__name__}: {e}"
        finally:
            record = app.state.recorder.pop(rid)
        traj = record.episode(row, self.chains)
        if traj is None:
            traj = Trajectory(turns=[Turn([], [], [], sampler.policy_version)], row=dict(row))
            error = error or "agent made no model calls"
        self._count(traj, record, params, timed_out)
        if error is None:
            traj, error = self._with_result(traj, result)
        if error is not None:
            log.warning("agent rollout failed: %s", error)
            traj = failed(traj, error)
        return traj

    def _client(self, cls: Any, url: str, rid: str) -> Any:
        """An `openai` client of the policy's endpoint whose requests carry the rollout id: in its base URL (the
        rollout's own, sampling/rollout_paths.py, so a framework that builds its own client needs only
        `str(client.base_url)`) and in a header; one try per call, each bounded by request_timeout_s."""
        return cls(
            base_url=rollout_base_url(url, rid),
            api_key="x",
            default_headers={"X-Rollout-Id": rid},
            timeout=self.request_timeout_s,
            max_retries=0,
        )

    def _count(self, traj: Trajectory, record: RolloutRecord, params: SampleParams | None, timed_out: bool) -> None:
        """The episode's metrics (each step's record has their means, `episode/agent/*`: calls, chains, calls left
        out of training, requests with a temperature other than the run's, timed out), and what the console is told
        once: calls split or dropped, a temperature other than the run's."""
        n_calls, n_chains = len(record.calls), len(record.chains())
        dropped = record.dropped_calls if self.chains == "longest" else 0
        traj.metrics.update(
            {
                "agent/calls": float(n_calls),
                "agent/chains": float(n_chains),
                "agent/dropped_calls": float(dropped),
                "agent/temperature_overrides": float(record.temperature_overrides),
                "agent/timed_out": float(timed_out),
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

    async def score(self, trajectories: list[Trajectory]) -> list[Score]:
        """Score the trajectories whose agent returned a final answer (or None) with the task's rubric; the
        others already carry the agent's reward."""
        todo = [t for t in trajectories if t.extra.get(NEEDS_RUBRIC) and not t.failed]
        if not todo:
            return [score_of(t) for t in trajectories]
        task = self.task
        assert task is not None  # _with_result marks NEEDS_RUBRIC only when there is a task
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
        by_id = {id(t): s for t, s in zip(todo, scores, strict=True)}
        return [by_id.get(id(t)) or score_of(t) for t in trajectories]

    def _with_result(self, traj: Trajectory, result: Any) -> tuple[Trajectory, str | None]:
        """The trajectory with the reward the agent returned; an error message when it cannot be used."""
        if isinstance(result, (bool, int, float)):
            reward = float(result)
            if not math.isfinite(reward):
                return traj, f"agent returned a non-finite reward {result!r}"
            return replace(traj, reward=reward, passed=reward >= self.pass_threshold), None
        if isinstance(result, dict):
            if "reward" not in result:
                return traj, f"agent returned a dict without 'reward': {sorted(result)}"
            try:
                reward = float(result["reward"])
                components = {
                    k: float(v)
                    for k, v in result.items()
                    if k not in ("reward", "passed") and isinstance(v, (int, float))
                }
            except (TypeError, ValueError) as e:
                return traj, f"agent returned a non-numeric reward: {e}"
            passed = bool(result.get("passed", reward >= self.pass_threshold))
            return replace(traj, reward=reward, reward_components=components, passed=passed), None
        if result is None or isinstance(result, str):
            if self.task is None:
                return traj, "agent returned no reward and AgentEnv has no task rubric to score its answer"
            text = result if isinstance(result, str) else traj.completion_text
            return replace(traj, completion_text=text, extra={**traj.extra, NEEDS_RUBRIC: True}), None
        return traj, f"agent must return a number, a dict, a string or None, got {type(result).__name__}"


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
