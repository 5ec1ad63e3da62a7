"""A scored record is made, never edited: scoring gives back scores, and these pure functions join them into new
trajectories (`Trajectory` is frozen).

    score_of(t)                       the score a trajectory already carries (an env whose rollout brings its reward)
    scored(t, score)                  the trajectory with a score: reward, components, passed, failed, error (and
                                      a NotedScore's notes: feedback, metrics, extra)
    failed(t, error)                  the trajectory failed: reward 0, not passed
    with_component(t, name, v, add)   one more reward component, `add` added to the reward (group rewards, shaping)
    scores_of_ok(ts, score)           `score` of those that did not fail, the others' own (multi-turn envs)
    await scored_by(env, ts)          env.score joined, not isolated (one scripted episode, a test)

`Env.score(trajectories) -> list[Score]` (envs/base.py) returns one rubric `Score` per trajectory; `score_groups`
joins them with `scored`, then the group rewards with `with_component`. Nothing downstream writes into a
trajectory, so nothing has to undo a half-written score (envs/isolate.py scores again from the same records).
An env that learns more about a sample while scoring it (the task's feedback it asked for, a metric) returns a
`NotedScore`, and `scored` joins its notes too: a wrapper's `replace(score, ...)` keeps them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from posttrain.rewards.rubric import Score
from posttrain.types import Trajectory


@dataclass
class NotedScore(Score):
    """A score with what the env noted about the sample while scoring it (guidance/insights.py: the task's feedback
    its insight writer read, whether the sample wrote an insight). `feedback`: the task's answer when the env asked
    it (score_groups then does not ask again); `metrics` and `extra` are added to the record's own."""

    feedback: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


def score_of(t: Trajectory) -> Score:
    """The score `t` carries now: what an env whose reward came with the rollout (OpenEnv, an agent's returned
    reward) answers to `score`."""
    return Score(t.reward, dict(t.reward_components), t.passed, t.failed, t.error)


def scored(t: Trajectory, s: Score, failed_in: str | None = None) -> Trajectory:
    """`t` with the score `s` (`failed_in`: "score" when isolation failed it, envs/isolate.py), and a NotedScore's
    notes (feedback the env set itself during its rollout stays: a task function never overwrites it)."""
    notes = s if isinstance(s, NotedScore) else NotedScore(0.0, {}, False)
    return replace(
        t,
        reward=s.reward,
        reward_components=dict(s.components),
        passed=s.passed,
        failed=s.failed,
        error=s.error,
        failed_in=failed_in if failed_in is not None else t.failed_in,
        feedback=t.feedback if t.feedback is not None else notes.feedback,
        metrics={**t.metrics, **notes.metrics} if notes.metrics else t.metrics,
        extra={**t.extra, **notes.extra} if notes.extra else t.extra,
    )


def failed(t: Trajectory, error: str, *, keep_reward: bool = False) -> Trajectory:
    """`t` failed with `error` (kept out of training, counted): not passed, reward 0 (`keep_reward`: a sample
    failed after it was scored, by a group reward that raised, keeps the reward it had), its components kept for
    the record."""
    return replace(t, reward=t.reward if keep_reward else 0.0, passed=False, failed=True, error=error)


def with_component(t: Trajectory, name: str, value: float, add: float) -> Trajectory:
    """`t` with reward component `name` = `value` and `add` added to its reward (a group reward: its weight times
    its value; a penalty: itself)."""
    return replace(t, reward=t.reward + add, reward_components={**t.reward_components, name: value})


def scores_of_ok(trajectories: list[Trajectory], score: Callable[[list[Trajectory]], list[Score]]) -> list[Score]:
    """`score` of the trajectories that did not fail (one batched call), the failed ones the score they carry."""
    ok = [t for t in trajectories if not t.failed]
    it = iter(score(ok) if ok else [])
    return [score_of(t) if t.failed else next(it) for t in trajectories]


async def scored_by(env: Any, trajectories: list[Trajectory]) -> list[Trajectory]:
    """The trajectories scored by `env` in one batched call, not isolated (a raise is the caller's: a test, a
    single scripted episode); a run's many samples go through envs/isolate.py `score_isolated` instead."""
    return [scored(t, s) for t, s in zip(trajectories, await env.score(trajectories), strict=True)]
