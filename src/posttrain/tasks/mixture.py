"""`mixture`: several tasks in one run, each keeping its own env, rewards, max tokens and stop strings.

    task:
      name: mixture
      options:
        tasks:
          - {name: count-a, weight: 2}
          - {name: reversal, options: {size: 3}, max_tokens: 8}
          - {name: reasoning_gym:leg_counting, weight: 1}

Each part (MixturePart, config/task_options.py: checked when the config is): `name` (any task name load_task
knows), `options`, `weight` (its share of the training prompts, 1 by default), `max_tokens` and `stop` (else the
task's own, else the run's), `label`. Parts are loaded with the run's seed (`run.seed`) and the config's
`task.max_observation_chars`. Every row carries the part it came from
in `TASK_COLUMN` (types.py), which is how the mixture's env and rubric send it to its own part, and how the step
and eval records break `pass_rate` and `reward` down per task (`task/<name>/...`, obs/rollout_stats.py). Held-out
rows are interleaved part by part, so `loop.eval_prompts` keeps every part in the eval; the run ends with a per-task
held-out table, and the `task_stalled` diagnostic names a part that stopped learning.

Not in a mixture (refused with the reason): parts with group rewards (scored per group of one task) or their own
env_factory that the mixture cannot send rows to.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import Any

from posttrain.config.task_options import MixtureOptions, MixturePart, OptionsError, parse
from posttrain.envs.smoke_checks import SmokeCheck
from posttrain.envs.task import Task, TaskLoadError
from posttrain.rewards.rubric import RewardComponent, Score
from posttrain.types import TASK_COLUMN, SampleParams, Trajectory


@dataclass
class Part:
    name: str
    task: Task
    weight: float = 1.0
    max_tokens: int | None = None
    stop: list[str] | None = None

    def params(self, run: SampleParams) -> SampleParams:
        """The run's sampling settings with this part's own length and stop strings."""
        stop = self.stop if self.stop is not None else (self.task.stop or run.stop)
        return replace(run, max_tokens=self.max_tokens or self.task.max_tokens or run.max_tokens, stop=list(stop))


def make_task(_run_seed: int = 0, _max_observation_chars: int | None = None, **options: Any) -> Task:
    """The mixture `options` (task.options) describe (MixtureOptions, config/task_options.py: the config's check
    too), its parts loaded with the run's seed (tasks/load.py passes it; task.options.seed, when set, draws the
    training rows instead) and the config's task.max_observation_chars (None: each part's own)."""
    from posttrain.tasks.load import load_task

    seed, max_observation_chars = _run_seed, _max_observation_chars

    try:
        opts = parse(MixtureOptions, options, "task.options")
    except OptionsError as e:
        raise TaskLoadError(f"mixture: {e}") from None
    parts = [_part(spec, load_task, seed, max_observation_chars) for spec in opts.tasks]
    return mixture_task(parts, seed if opts.seed is None else opts.seed)


def _part(spec: MixturePart, load_task: Any, seed: int, max_observation_chars: int | None) -> Part:
    task = load_task(spec.name, spec.options, seed=seed, max_observation_chars=max_observation_chars)
    if task.group_rewards:
        raise TaskLoadError(f"mixture: {spec.name} has group rewards, which a mixture does not score yet")
    if task.env_factory is not None and task.tools:
        raise TaskLoadError(f"mixture: {spec.name} has both tools and its own env_factory")
    stop = list(spec.stop) if spec.stop is not None else None
    return Part(spec.key, task, spec.weight, spec.max_tokens, stop)


def mixture_task(parts: list[Part], seed: int = 0) -> Task:
    """One Task over `parts`: training rows in proportion to the weights, held-out rows interleaved."""
    rng = random.Random(seed)
    tagged = {
        p.name: (
            [{**r, TASK_COLUMN: p.name} for r in p.task.train_rows],
            [{**r, TASK_COLUMN: p.name} for r in p.task.eval_rows],
        )
        for p in parts
    }
    total_rows = sum(len(t) for t, _ in tagged.values())
    total_w = sum(p.weight for p in parts)
    train: list[dict[str, Any]] = []
    for p in parts:
        rows = tagged[p.name][0]
        n = max(1, round(p.weight / total_w * total_rows))  # its share of the training prompts
        train += [rows[i % len(rows)] for i in rng.sample(range(max(n, len(rows))), n)]
    rng.shuffle(train)
    evals = _interleave([tagged[p.name][1] for p in parts])
    by_name = {p.name: p for p in parts}
    checks = [
        replace(c, name=f"{p.name}: {c.name}", row={**(c.row or p.task.train_rows[0]), TASK_COLUMN: p.name})
        for p in parts
        for c in (p.task.smoke_checks or [SmokeCheck("scores an empty completion", completion="", expect="no_error")])
    ]
    return Task(
        name="mixture(" + ",".join(by_name) + ")",
        train_rows=train,
        eval_rows=evals,
        rubric=MixtureRubric(by_name),  # type: ignore[arg-type]  # a Rubric by its interface
        max_tokens=max((p.max_tokens or p.task.max_tokens or 0) for p in parts) or None,
        env_factory=lambda task, tok, params: MixtureEnv(task, by_name, tok, params),
        smoke_checks=checks,
        train_pass=all(p.task.train_pass for p in parts),
    )


def _interleave(lists: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    out = []
    for i in range(max((len(x) for x in lists), default=0)):
        out += [x[i] for x in lists if i < len(x)]
    return out


@dataclass
class MixtureRubric:
    """The Rubric interface over the parts' own rubrics: each row is scored by its part's (the env scores that way
    too; this serves the env check and anything that scores through `task.rubric`)."""

    parts: dict[str, Part]
    pass_component: str | None = None
    gates: list[str] = field(default_factory=list)
    normalize: bool = False

    @property
    def components(self) -> list[RewardComponent]:
        seen: dict[str, RewardComponent] = {}
        for p in self.parts.values():
            for c in p.task.rubric.components:
                seen.setdefault(c.name, c)
        return list(seen.values())

    @property
    def timeout_s(self) -> float | None:
        return next(iter(self.parts.values())).task.rubric.timeout_s

    @timeout_s.setter
    def timeout_s(self, v: float | None) -> None:  # task.reward_timeout_s reaches every part
        for p in self.parts.values():
            p.task.rubric.timeout_s = v

    def score(self, completions: list[Any], rows: list[dict[str, Any]], **extra: list[Any]) -> list[Score]:
        out: list[Score | None] = [None] * len(rows)
        for name, idx in _by_part(rows).items():
            part = self.parts[name]
            comps = [_as_format(completions[i], part.task.conversational) for i in idx]
            sub_rows = [{k: v for k, v in rows[i].items() if k != TASK_COLUMN} for i in idx]
            scores = part.task.rubric.score(comps, sub_rows, **{k: [v[i] for i in idx] for k, v in extra.items()})
            for i, s in zip(idx, scores, strict=True):
                out[i] = s
        return out  # type: ignore[return-value]  # every row belongs to a part


def _part_row(row: dict[str, Any]) -> dict[str, Any]:
    """A mixture row as its part's row: without the mixture's column."""
    return {k: v for k, v in row.items() if k != TASK_COLUMN}


def _by_part(rows: list[dict[str, Any]]) -> dict[str, list[int]]:
    groups: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        if TASK_COLUMN not in r:
            raise ValueError(f"a mixture row has no {TASK_COLUMN!r} column: {str(r)[:200]}")
        groups.setdefault(r[TASK_COLUMN], []).append(i)
    return groups


def _as_format(completion: Any, conversational: bool) -> Any:
    """A completion in the format a part's reward functions take (text, or TRL's message list)."""
    if conversational:
        return completion if isinstance(completion, list) else [{"role": "assistant", "content": completion}]
    return completion[-1]["content"] if isinstance(completion, list) else completion


class MixtureEnv:
    """Sends each row to its part's own env (built by make_env from the part's task), with the part's max tokens
    and stop strings; scores each part's trajectories with that part's env."""

    def __init__(self, task: Task, parts: dict[str, Part], tokenizer: Any, params: SampleParams):
        from posttrain.envs.base import make_env

        self.task, self.parts, self.params = task, parts, params
        self.envs = {name: make_env(p.task, tokenizer, p.params(params)) for name, p in parts.items()}

    async def rollout(self, row: dict[str, Any], sampler: Any, params: SampleParams | None = None) -> Trajectory:
        name = row[TASK_COLUMN]
        return await self.envs[name].rollout(row, sampler, self.parts[name].params(params or self.params))

    async def score(self, trajectories: list[Trajectory]) -> list[Score]:
        """Each part's trajectories scored by its env, shown as records whose rows lack the mixture's column (a
        part's reward functions take the columns of its own rows); the scores in the order asked."""
        out: list[Score | None] = [None] * len(trajectories)
        for name, idx in _by_part([t.row for t in trajectories]).items():
            plain = [replace(trajectories[i], row=_part_row(trajectories[i].row)) for i in idx]
            for i, s in zip(idx, await self.envs[name].score(plain), strict=True):
                out[i] = s
        return [s for s in out if s is not None]
