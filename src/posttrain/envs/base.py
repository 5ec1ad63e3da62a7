"""The Env protocol: an episode turns one task row into a Trajectory by calling a Sampler.

    async def rollout(row, sampler, params=None) -> Trajectory   one episode (single- or multi-turn); params:
                                                                 how to sample (None: the env's own defaults)
    async def score(trajectories) -> None                        set rewards; batched so reward models can batch

Envs never touch the trainer. A GRPO group is G concurrent rollouts of the same row; samplers coalesce
concurrent calls into one batch, so an env can stay written one episode at a time.

Group-level scoring: some rewards only exist relative to the other completions of the same prompt (a judge that
ranks all G at once, a pairwise tournament, a relative-length bonus). A task declares them as `group_rewards`,
functions called once per group with the G completions (see `score_groups`); the loop and the held-out eval
call `score_groups` after `score`. Then the task's `feedback` (envs/feedback.py) describes, in words, what went
wrong with each sample that did not pass.

Callers that roll out many rows use `safe_rollout` (envs/isolate.py), and `score_groups` scores through
`score_isolated`: an env that raises on one sample's output fails that sample only.
"""

from __future__ import annotations

import inspect
import math
from typing import Any, Protocol, runtime_checkable

from posttrain.envs.feedback import attach_feedback
from posttrain.envs.isolate import safe_rollout, score_isolated  # noqa: F401 - safe_rollout: for the collectors
from posttrain.envs.task import Task
from posttrain.sampling.base import Sampler
from posttrain.types import SampleParams, Trajectory


@runtime_checkable
class Env(Protocol):
    async def rollout(
        self, row: dict[str, Any], sampler: Sampler, params: SampleParams | None = None
    ) -> Trajectory: ...

    async def score(self, trajectories: list[Trajectory]) -> None: ...


class TaskEnv(Env, Protocol):
    """An Env that says which task it runs (every env `make_env` builds): the held-out eval reads its rubric."""

    task: Task


def make_env(task: Any, tokenizer: Any, params: SampleParams) -> TaskEnv:
    """The env a task runs in: its own (Task.env_factory), else a ToolEnv when it has tools, else single-turn."""
    from posttrain.envs.single_turn import SingleTurnEnv
    from posttrain.envs.tool_env import ToolEnv

    if task.env_factory is not None:
        return task.env_factory(task, tokenizer, params)
    if task.tools:
        return ToolEnv(
            task,
            tokenizer,
            params,
            task.tools,
            max_turns=max(task.max_turns, 1),
            tool_timeout_s=task.tool_timeout_s,
            final_tool=task.final_tool,
        )
    return SingleTurnEnv(task, tokenizer, params)


async def score_groups(env: Env, groups_G: list[list[Trajectory]]) -> None:
    """Score every trajectory (one batched `env.score` call), then apply the task's group rewards per group.

    A group reward is `fn(completions_G, **columns) -> list[float]` with TRL's column convention (the group's
    row columns, each a list of G values): its score goes into `reward_components[fn.__name__]` and, times its
    weight (`Task.group_reward_weights`, default 1), into the reward. A group reward that raises, returns the
    wrong number of scores or a score that is not finite fails that group's samples only (counted like any failed
    reward). An `env.score` that raises fails only the samples whose own scoring raises (envs/isolate.py)."""
    await score_isolated(env, [t for g in groups_G for t in g])
    task = getattr(env, "task", None)
    fns = list(getattr(task, "group_rewards", None) or [])
    if not fns:
        attach_feedback(task, [t for g in groups_G for t in g])
        return
    weights = list(getattr(task, "group_reward_weights", None) or [1.0] * len(fns))
    for g in groups_G:
        ok = [t for t in g if not t.failed]
        if not ok:
            continue
        completions = [t.completion_text for t in ok]
        cols = {k: [t.row.get(k) for t in ok] for k in ok[0].row if k != "prompt"}
        for fn, w in zip(fns, weights):
            name = getattr(fn, "__name__", "group_reward")
            try:
                scores = fn(completions, prompts=[t.row.get("prompt") for t in ok], **cols)
                if inspect.isawaitable(scores):
                    scores = await scores
                scores = [float(x) for x in scores]
                if len(scores) != len(ok):
                    raise ValueError(f"returned {len(scores)} scores for {len(ok)} completions")
                if not all(math.isfinite(x) for x in scores):  # NaN/inf is no score (as in the rubric)
                    raise ValueError(f"returned a score that is not a finite number: {scores}")
            except Exception as e:  # noqa: BLE001 - a broken group reward fails its samples, not the run
                for t in ok:
                    t.failed, t.error = True, f"group reward {name} raised {type(e).__name__}: {e}"
                break
            for t, s in zip(ok, scores, strict=True):
                t.reward_components[name] = s
                t.reward += w * s
    attach_feedback(task, [t for g in groups_G for t in g])
