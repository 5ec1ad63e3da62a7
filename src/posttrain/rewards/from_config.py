"""Rewards named in the config (`task.rewards`), added to any task's rubric without code.

    task:
      rewards:
        - {fn: math, weight: 1.0, answer_column: answer}   # a named reward (rewards/named.py)
        - {fn: format, weight: 0.2}
        - {fn: reward_model, path: runs/rm/product-blurb, weight: 0.5}
        - {fn: embedding_margin, weight: 1.0}          # needs the rows' query / engaged columns

Each entry: `fn` (a named reward of rewards/named.py, reward_model or embedding_margin), optional `weight` (1.0),
`name` (default: the fn) and `pass` (true: this one decides the pass), and the reward's options (named rewards:
their options dataclass; reward_model: path, batch_size, device, max_length; embedding_margin: model, device,
format_penalty). A named reward that reads the answer gets `answer_format` from `task.answer_format` unless the
entry sets its own.

Who decides the pass (the headline pass rate):
- a task with a rubric of its own (a built-in or a task file): its own pass component, as before; the entries are
  appended with a pass threshold of -inf, unless one says `pass: true` (then it decides, at >= 1.0);
- a task with no rubric of its own (`task.dataset`): the entry marked `pass: true`, else the first correctness
  reward (math, exact, numeric, contains, regex, choice, json_schema; never format or length), at >= 1.0.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from posttrain.config.reward_options import EntryError, options_of, parse_entry, takes_answer_format
from posttrain.rewards.named import (
    NAMED_REWARDS,
    NamedReward,
    RewardConfigError,
    missing_column_message,
    named_reward,
)
from posttrain.rewards.rubric import RewardComponent, Rubric

__all__ = [
    "REWARD_FACTORIES",
    "RewardConfigError",
    "add_rewards",
    "check_columns",
    "components_from_specs",
    "rubric_from_specs",
]


def _reward_model(**kw: Any) -> Callable[..., Any]:
    from posttrain.rewards.reward_model import reward_model

    return reward_model(**kw)  # `path` is required by its options model (config/reward_options.py)


def _embedding_margin(**kw: Any) -> Callable[..., Any]:
    from posttrain.rewards.embedding import embedding_margin

    return embedding_margin(**kw)


REWARD_FACTORIES: dict[str, Callable[..., Callable[..., Any]]] = {
    "reward_model": _reward_model,
    "embedding_margin": _embedding_margin,
}
KNOWN = [*NAMED_REWARDS, *REWARD_FACTORIES]  # config/reward_options.py OPTIONS names the same (a test holds them)


@dataclass(frozen=True)
class Entry:
    """One `task.rewards` entry, built."""

    component: RewardComponent
    correctness: bool  # a named correctness reward (may decide a dataset task's pass)
    decides: bool  # the entry said `pass: true`


def _entry(i: int, spec: Any, answer_format: str) -> Entry:
    """Entry i built; its keys and options checked by config/reward_options.py's models (the config's check)."""
    where = f"task.rewards[{i}]"
    try:
        e = parse_entry(spec)
    except EntryError as err:
        raise RewardConfigError(f"{where}.{err.path}: {err.detail}" if err.path else f"{where}: {err.detail}") from None
    kw = dict(e.options)
    try:
        if e.fn in NAMED_REWARDS:
            if takes_answer_format(e.fn):
                kw.setdefault("answer_format", answer_format)
            func: Any = named_reward(e.fn, name=e.name, **kw)
        else:
            options = options_of(e.fn, kw)  # the factory's own defaults where the entry set nothing
            func = REWARD_FACTORIES[e.fn](**{k: v for k, v in vars(options).items() if v is not None}, name=e.name)
    except (TypeError, RewardConfigError, EntryError) as err:
        raise RewardConfigError(f"{where} ({e.fn}): {err}") from None
    correctness = isinstance(func, NamedReward) and func.correctness
    return Entry(RewardComponent(name=e.name, func=func, weight=e.weight), correctness, e.decides)


def _entries(specs: Sequence[Any], answer_format: str) -> list[Entry]:
    entries = [_entry(i, s, answer_format) for i, s in enumerate(specs)]
    marked = [e.component.name for e in entries if e.decides]
    if len(marked) > 1:
        raise RewardConfigError(f"task.rewards: only one entry may say `pass: true`, got {', '.join(marked)}")
    return entries


def components_from_specs(specs: list[dict[str, Any]], answer_format: str = "auto") -> list[RewardComponent]:
    """The components `specs` name, none of them deciding the pass (threshold -inf)."""
    return [_with_threshold(e.component, float("-inf")) for e in _entries(specs, answer_format)]


def _with_threshold(c: RewardComponent, threshold: float) -> RewardComponent:
    return RewardComponent(name=c.name, func=c.func, weight=c.weight, gate=c.gate, pass_threshold=threshold)


def add_rewards(rubric: Rubric, specs: list[dict[str, Any]], answer_format: str = "auto") -> Rubric:
    """A new rubric: `rubric`'s components, then the ones `specs` name (names must stay unique). The task's pass
    component keeps deciding the pass unless an entry says `pass: true`."""
    if not specs:
        return rubric
    entries = _entries(specs, answer_format)
    added = [_with_threshold(e.component, 1.0 if e.decides else float("-inf")) for e in entries]
    decider = next((e.component.name for e in entries if e.decides), rubric.pass_component)
    try:
        return Rubric(
            components=[*rubric.components, *added],
            pass_component=decider,
            gates=list(rubric.gates),
            normalize=rubric.normalize,
            timeout_s=rubric.timeout_s,
        )
    except ValueError as e:  # a name the task's rubric already has
        raise RewardConfigError(f"task.rewards: {e}; give the entry another `name`") from None


def rubric_from_specs(specs: list[dict[str, Any]], answer_format: str = "auto") -> Rubric:
    """The rubric of a task that has none of its own (a dataset task): every entry at pass threshold 1.0, the pass
    decided by the entry marked `pass: true`, else the first correctness reward."""
    entries = _entries(specs, answer_format)
    decider = next((e for e in entries if e.decides), None) or next((e for e in entries if e.correctness), None)
    if decider is None:
        raise RewardConfigError(
            "task.rewards: nothing decides the pass: add a correctness reward ("
            + ", ".join(k for k, s in NAMED_REWARDS.items() if s.correctness)
            + ") or mark one entry `pass: true`"
        )
    try:
        return Rubric(components=[e.component for e in entries], pass_component=decider.component.name)
    except ValueError as e:
        raise RewardConfigError(f"task.rewards: {e}; give the entry another `name`") from None


def check_columns(rubric: Rubric, columns: Sequence[str]) -> None:
    """Refuse, before anything is scored, a named reward reading a column the task's rows do not have."""
    for c in rubric.components:
        if isinstance(c.func, NamedReward):
            for option, column in c.func.columns().items():
                if column not in columns:
                    raise RewardConfigError(
                        f"task.rewards: {missing_column_message(c.name, c.func.fn, column, columns)}"
                        f"; set the entry's {option}"
                    )
