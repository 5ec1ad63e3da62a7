"""The Env protocol: an episode turns one task row into a Trajectory by calling a Sampler.

    async def rollout(row, sampler, params=None) -> Trajectory   one episode (single- or multi-turn); params:
                                                                 how to sample (None: the env's own defaults)
    async def score(trajectories) -> list[Score]                 one score per trajectory; batched so reward
                                                                 models can batch (joined by envs/scoring.py)

Envs never touch the trainer. A GRPO group is G concurrent rollouts of the same row; samplers coalesce
concurrent calls into one batch, so an env can stay written one episode at a time.

Group-level scoring: some rewards only exist relative to the other completions of the same prompt (a judge that
ranks all G at once, a pairwise tournament, a relative-length bonus). A task declares them as `group_rewards`,
functions called once per group with the G completions (see `score_groups`); the loop and the held-out eval
call `score_groups` after `score`. Then the task's `feedback` (envs/feedback.py) describes, in words, what went
wrong with each sample that did not pass.

Callers that roll out many rows use `safe_rollout` (envs/isolate.py), and `score_groups` scores through
`score_isolated`: an env that raises on one sample's output fails that sample only. A trajectory is frozen:
`score_groups` returns the scored trajectories as new records, the rollouts it was given are left as they were.
"""

from __future__ import annotations

import inspect
import math
from typing import Any, Protocol, runtime_checkable

from posttrain.envs.feedback import attach_feedback
from posttrain.envs.isolate import safe_rollout, score_isolated  # noqa: F401 - safe_rollout: for the collectors
from posttrain.envs.scoring import failed, with_component
from posttrain.envs.task import Task
from posttrain.rewards.rubric import Score
from posttrain.sampling.base import Sampler
from posttrain.types import SampleParams, Trajectory


@runtime_checkable
class Env(Protocol):
    async def rollout(
        self, row: dict[str, Any], sampler: Sampler, params: SampleParams | None = None
    ) -> Trajectory: ...

    async def score(self, trajectories: list[Trajectory]) -> list[Score]: ...


class TaskEnv(Env, Protocol):
    """An Env that says which task it runs (every env `make_env` builds, and the wrappers round one): the held-out
    eval reads its rubric, `score_groups` its group rewards and feedback. Read-only here: a plain attribute or a
    wrapper's property."""

    @property
    def task(self) -> Task: ...


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


async def score_groups(env: TaskEnv, groups_G: list[list[Trajectory]]) -> list[list[Trajectory]]:
    """The groups scored: every trajectory by one batched `env.score` call, then the task's group rewards per
    group, then the task's feedback. Returns new trajectories, group by group (the given ones are not edited).

    A group reward is `fn(completions_G, **columns) -> list[float]` with TRL's column convention (the group's
    row columns, each a list of G values): its score goes into `reward_components[fn.__name__]` and, times its
    weight (`Task.group_reward_weights`, default 1), into the reward. A group reward that raises, returns the
    wrong number of scores or a score that is not finite fails that group's samples only (counted like any failed
    reward). An `env.score` that raises fails only the samples whose own scoring raises (envs/isolate.py)."""
    flat = await score_isolated(env, [t for g in groups_G for t in g])
    sizes = [len(g) for g in groups_G]
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    out = [flat[a : a + n] for a, n in zip(starts, sizes, strict=True)]
    task = env.task
    fns = list(task.group_rewards)
    if fns:
        weights = list(task.group_reward_weights or [1.0] * len(fns))
        out = [await _with_group_rewards(g, fns, weights) for g in out]
    fed = attach_feedback(task, [t for g in out for t in g])
    return [fed[a : a + n] for a, n in zip(starts, sizes, strict=True)]


async def _with_group_rewards(group: list[Trajectory], fns: list[Any], weights: list[float]) -> list[Trajectory]:
    """One group with the task's group rewards joined in (its failed samples as they are)."""
    ok = [i for i, t in enumerate(group) if not t.failed]
    if not ok:
        return group
    out = list(group)
    for fn, w in zip(fns, weights):
        name = getattr(fn, "__name__", "group_reward")
        live = [out[i] for i in ok]
        try:
            scores = await _group_scores(fn, live)
        except Exception as e:  # noqa: BLE001 - a broken group reward fails its samples, not the run
            error = f"group reward {name} raised {type(e).__name__}: {e}"
            for i in ok:
                out[i] = failed(out[i], error, keep_reward=True)
            break
        for i, s in zip(ok, scores, strict=True):
            out[i] = with_component(out[i], name, s, w * s)
    return out


async def _group_scores(fn: Any, ok: list[Trajectory]) -> list[float]:
    """A group reward's scores of the group's samples, checked: one finite number each."""
    completions = [t.completion_text for t in ok]
    cols = {k: [t.row.get(k) for t in ok] for k in ok[0].row if k != "prompt"}
    scores = fn(completions, prompts=[t.row.get("prompt") for t in ok], **cols)
    if inspect.isawaitable(scores):
        scores = await scores
    scores = [float(x) for x in scores]
    if len(scores) != len(ok):
        raise ValueError(f"returned {len(scores)} scores for {len(ok)} completions")
    if not all(math.isfinite(x) for x in scores):  # NaN/inf is no score (as in the rubric)
        raise ValueError(f"returned a score that is not a finite number: {scores}")
    return scores
