"""Run a `verifiers` (0.4, `verifiers.v1`) environment as a posttrain env (`task.name=verifiers:...`,
docs/verifiers.md).

Its tasks become the rows (each row carries the task's wire data in `TASK_COLUMN`), its rewards the rubric
(`verifiers_rubric`), and every model call it makes reaches the policy through posttrain's token-capturing
OpenAI-compatible endpoint, the one AgentEnv serves (`AgentEnv.server_for`): the trajectory is built from the
exact prompt ids, completion ids and sampler logprobs the server recorded, never from re-tokenized text.

One rollout (`VerifiersEnv.rollout`):
  * the row's task is rebuilt from its wire data and played by the verifiers Env (`Env.run_episode`), under
    `timeout_s`, on a thread with an event loop of its own (envs/episode_threads.py: one episode at a time per
    thread, each thread holding its own copy of the env inside `Env.serving()`), so env code that blocks (a
    `time.sleep` in a reward, a synchronous HTTP client, CPU-bound work) stalls that episode only, never the
    caller's loop, the endpoint or the other episodes, and the timeout holds for it too;
  * the seats that would run verifiers' default program (the `bash` harness in a Prime sandbox) or its tool-less
    `null` chat loop run `PosttrainChatHarness` (envs/verifiers_harness.py) instead: the same chat loop, in
    process, non-streaming, with MCP tools, each env message cut to `max_observation_chars` (bounded.truncate_text)
    and each call bounded;
  * each trainable seat's calls carry their own rollout id (`<rollout>/<trace id>`), so the server records them
    apart; the first trainable trace that made a model call is the trajectory (its turns are its model calls,
    the env's messages between them loss-masked, as AgentEnv's);
  * verifiers scores the trace (its `@vf.reward`s, weights kept); `score()` reads those scores through the task's
    rubric. An exception, an error on the trace or the timeout fails that sample only, with the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import uuid
import weakref
from collections.abc import AsyncIterator
from dataclasses import replace
from functools import partial
from typing import Any

import verifiers.v1 as vf
from verifiers.v1.dialects.chat import message_to_wire

from posttrain.envs.agent import AgentEnv
from posttrain.envs.episode_threads import EpisodeThreads
from posttrain.envs.scoring import failed, scores_of_ok
from posttrain.envs.single_turn import score_with_rubric
from posttrain.envs.task import Task
from posttrain.envs.verifiers_harness import HARNESS_ID, ROLLOUT_ID, PosttrainChatHarnessConfig
from posttrain.rewards.rubric import RewardComponent, Rubric, Score
from posttrain.sampling.base import Sampler
from posttrain.types import SampleParams, Trajectory, Turn

log = logging.getLogger(__name__)

TASK_COLUMN = "verifiers_task"  # a row's verifiers task, as its wire data (TaskData.model_dump)
REWARDS_COLUMN = "verifiers_rewards"  # a rollout's recorded rewards: {name: {"score", "weight"}}
OTHER_REWARDS = "verifiers_other"  # rubric component: rewards not known before the rollout (keyed results, finalize)
ERROR_CHARS = 500  # of an error message kept on a failed trajectory


# ---- building the verifiers env ------------------------------------------------------------------------------


def with_posttrain_seats(config: vf.EnvConfig, harness: dict[str, Any], max_turns: int) -> vf.EnvConfig:
    """`config` with every seat that runs verifiers' default program (no harness pinned, and the taskset ships
    none: `bash`) or its `null` chat loop switched to PosttrainChatHarness (`harness`: its knobs) in the local
    subprocess runtime (instead of a Prime sandbox), and every seat's model turns bounded by `max_turns` where the
    env sets no bound. Seats pinning another harness (a shell, a coding agent, a browser), or falling back to one
    the taskset ships, keep it: those need their program installed, usually a container."""
    default_is_bash = vf.default_harness_id(config.taskset.id) == "bash"
    update = {}
    for name, seat in config:
        if not isinstance(seat, vf.AgentConfig):
            continue
        changes: dict[str, Any] = {"max_turns": seat.max_turns or max_turns}
        pinned = seat.harness.id if seat.harness is not None else None
        if (pinned is None and default_is_bash) or pinned in ("null", HARNESS_ID):
            changes["harness"] = PosttrainChatHarnessConfig(**harness)
            if isinstance(seat.runtime, vf.PrimeConfig):
                changes["runtime"] = vf.SubprocessConfig()
        update[name] = seat.model_copy(update=changes)
    return config.model_copy(update=update)


def vf_task_of(env: vf.Env, row: dict[str, Any]) -> vf.Task:
    """The verifiers task a row carries, rebuilt from its wire data (as verifiers rebuilds a task from a trace)."""
    task_cls = env.taskset.task_type()
    return task_cls(task_cls.data_type().model_validate(row[TASK_COLUMN]), env.taskset.config.task)


def task_row(task: vf.Task) -> dict[str, Any]:
    """A posttrain row for a verifiers task: its prompt (shown in reports; the env sends the task's own) and its
    wire data."""
    prompt = task.data.prompt
    if not isinstance(prompt, str):
        prompt = [message_to_wire(m) for m in prompt] if prompt else ""
    return {"prompt": prompt, TASK_COLUMN: task.data.model_dump(mode="json", exclude_none=True)}


# ---- the rubric ------------------------------------------------------------------------------------------------


def reward_weights(task: vf.Task) -> dict[str, float]:
    """The task's rewards in the order verifiers runs them (highest priority, then name), with their weights: its
    `@vf.reward` methods and plugged rewards, then its judges."""
    out = {fn.__name__: float(getattr(fn, "_vf_weight", 1.0)) for fn in task.hooks("reward")}
    for judge in task.plugged_judges():
        out.setdefault(judge.reward_name, float(judge.config.weight))
    return out


def verifiers_rubric(task: vf.Task, pass_reward: str | None = None) -> Rubric:
    """One component per reward of the verifiers task (the score verifiers recorded, weight kept), plus
    `verifiers_other` (the weighted sum of rewards only known once a rollout ran: keyed results, an env's
    finalize), so the reward is verifiers' own total. A sample passes when `pass_reward` (default: the first
    reward verifiers runs) scores >= 1."""
    weights = reward_weights(task)
    comps = [RewardComponent(name, _score_of(name), weight=w) for name, w in weights.items()]
    comps.append(RewardComponent(OTHER_REWARDS, _other_rewards(set(weights)), weight=1.0))
    headline = pass_reward or (next(iter(weights)) if weights else OTHER_REWARDS)
    if headline not in weights and headline != OTHER_REWARDS:
        raise ValueError(f"pass_reward {headline!r} is not a reward of this verifiers task: {sorted(weights)}")
    return Rubric(comps, pass_component=headline)


def _score_of(name: str):
    def score(completions: list[Any], verifiers_rewards: list[Any] | None = None, **_: Any) -> list[float | None]:
        recorded = verifiers_rewards or [None] * len(completions)
        return [((r or {}).get(name) or {}).get("score") for r in recorded]

    score.__name__ = name
    return score


def _other_rewards(known: set[str]):
    def verifiers_other(completions: list[Any], verifiers_rewards: list[Any] | None = None, **_: Any) -> list[float]:
        recorded = verifiers_rewards or [None] * len(completions)
        return [sum(v["score"] * v["weight"] for k, v in (r or {}).items() if k not in known) for r in recorded]

    return verifiers_other


# ---- the env -----------------------------------------------------------------------------------------------------


class VerifiersEnv:
    """A posttrain Env playing `vf_env`'s tasks (see the module docstring). `task`: the posttrain task (its rubric
    scores what verifiers recorded, `verifiers_rubric`). `timeout_s` bounds one whole episode, `request_timeout_s`
    one model call (the server's sampler timeout); `max_tokens` is the server's default when a call sets none.
    `episode_threads` episodes run at once (each on its own thread; more wait for one); `max_stuck_threads`
    threads may stay blocked past `timeout_s` (a sleeping thread cannot be killed): at that cap new episodes fail
    at once, with the reason, until one returns."""

    def __init__(
        self,
        vf_env: vf.Env,
        task: Task,
        tokenizer: Any,  # the policy's: the endpoint renders chat templates with it (AgentEnv's, required there)
        timeout_s: float = 300.0,
        request_timeout_s: float = 120.0,
        max_tokens: int | None = None,
        model_name: str = "policy",
        episode_threads: int = 64,
        max_stuck_threads: int = 8,
    ):
        self.vf_env = vf_env
        self.task = task
        self.timeout_s = timeout_s
        self.max_tokens = max_tokens or task.max_tokens or 512
        self.model_name = model_name
        # AgentEnv's endpoint, one per (event loop, sampler): the same token-capturing server an agent gets.
        self._endpoint = AgentEnv(
            _no_agent,
            tokenizer=tokenizer,
            timeout_s=timeout_s,
            request_timeout_s=request_timeout_s,
            model_name=model_name,
            max_tokens=self.max_tokens,
        )
        self.threads = EpisodeThreads(
            partial(_serving, vf_env), episode_threads, max_stuck_threads, name="posttrain-verifiers"
        )
        # An env dropped without close() (the loop does not close its envs) still stops its idle threads.
        weakref.finalize(self, self.threads.stop_idle)

    async def rollout(self, row: dict[str, Any], sampler: Sampler, params: SampleParams | None = None) -> Trajectory:
        rid = uuid.uuid4().hex
        episode, error, records, served, timed_out = None, None, {}, [], False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        try:
            # The endpoint serves in this loop (the sampler's); the episode reaches it over HTTP from its thread.
            srv, app = await asyncio.wait_for(self._endpoint.server_for(sampler), self.timeout_s)
            served.append(app)
            play = partial(_play, row, self._context(srv.url, params), rid)
            episode = await self.threads.run(play, max(deadline - loop.time(), 0.0))
        except TimeoutError:
            timed_out = True
            error = f"verifiers episode timed out after {self.timeout_s}s"
        except Exception as e:  # noqa: BLE001 - a broken env fails its sample, not the run
            error = f"verifiers env raised {type(e).__name__}: {str(e)[:ERROR_CHARS]}"
        finally:
            if served:  # also when cancelled: the server keeps no record of a finished rollout
                records = _pop_records(served[0], rid)
        traj = self._trajectory(row, episode, records, sampler, error, timed_out)
        if traj.failed:
            log.warning("verifiers rollout failed: %s", traj.error)
        return traj

    async def score(self, trajectories: list[Trajectory]) -> list[Score]:
        return scores_of_ok(
            trajectories,
            lambda ok: score_with_rubric(self.task, ok, lambda t: {REWARDS_COLUMN: t.extra.get(REWARDS_COLUMN, {})}),
        )

    async def close(self) -> None:
        """Stops the episode threads (a stuck one once it returns) and this loop's endpoint."""
        await self.threads.close()
        await self._endpoint.close()

    # ---- one episode -----------------------------------------------------------------------------------------
    def _context(self, url: str, params: SampleParams | None) -> vf.ModelContext:
        """The model the env's seats call: the posttrain endpoint, sampling as the run asks (verifiers imposes
        these on every call; a seat's own sampling settings still win, as in verifiers)."""
        p = params or SampleParams(max_tokens=self.max_tokens)
        sampling: dict[str, Any] = {"temperature": p.temperature, "top_p": p.top_p, "max_tokens": p.max_tokens}
        if p.top_k:
            sampling["top_k"] = p.top_k
        if p.stop:
            sampling["stop"] = list(p.stop)
        # One connection per call: a kept-alive connection the endpoint closes as idle (5 s) while a thread sends
        # on it fails that call with a bare ReadError (seen in the learning test on a loaded machine).
        client = vf.EvalClientConfig(
            base_url=url + "/v1", api_key_var="POSTTRAIN_VERIFIERS_UNUSED_KEY", headers={"Connection": "close"}
        )
        return vf.ModelContext(model=self.model_name, client=client, sampling=vf.SamplingConfig(**sampling))

    def _trajectory(
        self,
        row: dict[str, Any],
        episode: Any,
        records: dict[str, Any],
        sampler: Sampler,
        error: str | None,
        timed_out: bool = False,
    ) -> Trajectory:
        """The episode's trajectory with its metrics (each step's record has their means, `episode/verifiers/*`)."""
        trace, record = _trained(episode, records) if episode is not None else (None, None)
        traj = record.trajectory(row) if record is not None else None
        if traj is None:
            traj = Trajectory(turns=[Turn([], [], [], sampler.policy_version)], row=dict(row))
        error = error or _episode_error(episode, trace)
        dropped = record.dropped_calls if record is not None else 0
        traj.metrics.update(
            {
                "verifiers/calls": float(len(record.calls) if record else 0),
                "verifiers/dropped_calls": float(dropped),
                "verifiers/untrained_traces": float(_untrained(episode, trace)),
                "verifiers/timed_out": float(timed_out),
            }
        )
        if trace is not None and error is None:
            traj = _with_trace(traj, trace)
        return failed(traj, error) if error is not None else traj


@contextlib.asynccontextmanager
async def _serving(vf_env: vf.Env) -> AsyncIterator[vf.Env]:
    """An episode thread's own copy of the env (built from the same config, with the author's taskset object, as
    tasks/verifiers_task.py builds it), serving (`Env.serving()`: shared tool servers, the interception pool, the
    env's start/stop) while the thread lives: serving state lives on the env object and on the thread's loop."""
    env = type(vf_env)(vf_env.config)
    env.taskset = vf_env.taskset
    async with env.serving():
        yield env


async def _play(row: dict[str, Any], ctx: vf.ModelContext, rid: str, env: vf.Env) -> Any:
    """One episode, on an episode thread's loop; its trainable seats' calls are tagged with `rid`."""
    ROLLOUT_ID.set(rid)  # this task's own context (the harness reads it)
    return await env.run_episode(vf_task_of(env, row), ctx)


async def _no_agent(client: Any, row: dict[str, Any]) -> None:
    raise RuntimeError("VerifiersEnv uses AgentEnv's endpoint only")


def _pop_records(app: Any, rid: str) -> dict[str, Any]:
    """Every call recorded under this rollout, by trace id."""
    recorder = app.state.recorder
    return {key.split("/", 1)[1]: recorder.pop(key) for key in recorder.rollout_ids() if key.startswith(rid + "/")}


def _trained(episode: Any, records: dict[str, Any]) -> tuple[Any, Any]:
    """The trace trained on, and its recorded calls: the first trainable trace that called the model."""
    for trace in episode.traces:
        record = records.get(trace.id)
        if record is not None and record.calls:
            return trace, record
    return None, None


def _untrained(episode: Any, trained: Any) -> int:
    """Trainable traces of the episode not trained on (a multi-agent env with several policy seats)."""
    if episode is None:
        return 0
    return sum(1 for t in episode.traces if t is not trained and (t.agent is None or t.agent.trainable))


def _episode_error(episode: Any, trace: Any) -> str | None:
    """Why an episode cannot be trained on, or None."""
    if episode is None:
        return None
    # Without a trained trace (its only call failed: nothing was recorded), any trace's error is the reason.
    traces = [trace] if trace is not None else episode.traces
    errors = list(episode.errors) + [e for t in traces if not t.ok for e in t.errors]
    if errors:
        e = errors[-1]
        return f"verifiers rollout failed: {e.type}: {e.message[:ERROR_CHARS]}"
    if trace is None:
        return "the verifiers env made no model call for the policy"
    unscored = sorted(k for k, r in trace.rewards.items() if r is None)
    if unscored:  # e.g. a scoring timeout: a reward of 0 there would be a guess, not a score
        return f"verifiers did not score {', '.join(unscored)} (stopped: {trace.stop_condition})"
    return None


def _with_trace(traj: Trajectory, trace: Any) -> Trajectory:
    """The trajectory with what verifiers recorded on the trace: its rewards (scored later by the rubric), metrics,
    final reply."""
    rewards = {k: {"score": r.score, "weight": r.weight} for k, r in trace.rewards.items() if r is not None}
    metrics = {
        f"verifiers/{k}": float(v) for k, v in trace.metrics.items() if isinstance(v, (int, float)) and math.isfinite(v)
    }
    return replace(
        traj,
        extra={**traj.extra, REWARDS_COLUMN: rewards},
        metrics={**traj.metrics, **metrics, "verifiers/turns": float(trace.num_turns)},
        completion_text=trace.last_reply,
        messages=[m.model_dump(exclude_none=True) for m in trace.messages],
        stop_reason="max_turns" if trace.stop_condition == "max_turns" else traj.stop_reason,
    )
