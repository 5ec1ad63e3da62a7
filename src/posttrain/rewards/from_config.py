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

from posttrain.rewards.named import (
    NAMED_REWARDS,
    NamedReward,
    RewardConfigError,
    missing_column_message,
    named_reward,
    nearest_name,
    takes_answer_format,
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

    if "path" not in kw:
        raise RewardConfigError("task.rewards: a reward_model entry needs `path` (a folder `posttrain rm train` wrote)")
    return reward_model(**kw)


def _embedding_margin(**kw: Any) -> Callable[..., Any]:
    from posttrain.rewards.embedding import embedding_margin

    return embedding_margin(**kw)


REWARD_FACTORIES: dict[str, Callable[..., Callable[..., Any]]] = {
    "reward_model": _reward_model,
    "embedding_margin": _embedding_margin,
}
KNOWN = [*NAMED_REWARDS, *REWARD_FACTORIES]


@dataclass(frozen=True)
class Entry:
    """One `task.rewards` entry, built."""

    component: RewardComponent
    correctness: bool  # a named correctness reward (may decide a dataset task's pass)
    decides: bool  # the entry said `pass: true`


def _entry(i: int, spec: Any, answer_format: str) -> Entry:
    where = f"task.rewards[{i}]"
    if not isinstance(spec, dict) or "fn" not in spec:
        raise RewardConfigError(f"{where} must be a mapping with `fn` (one of {', '.join(KNOWN)}), got {spec!r}")
    kw = dict(spec)
    fn, weight, name, decides = kw.pop("fn"), kw.pop("weight", 1.0), kw.pop("name", None), kw.pop("pass", False)
    if fn not in KNOWN:
        raise RewardConfigError(f"{where}: unknown fn {fn!r}{nearest_name(str(fn), KNOWN)}; known: {', '.join(KNOWN)}")
    if isinstance(weight, bool) or not isinstance(weight, (int, float)):
        raise RewardConfigError(f"{where} ({fn}): weight must be a number, got {type(weight).__name__} {weight!r}")
    if not isinstance(decides, bool):
        raise RewardConfigError(f"{where} ({fn}): pass must be true or false, got {decides!r}")
    name = str(name or fn)
    try:
        if fn in NAMED_REWARDS:
            if takes_answer_format(fn):
                kw.setdefault("answer_format", answer_format)
            func: Any = named_reward(fn, name=name, **kw)
        else:
            func = REWARD_FACTORIES[fn](**kw, name=name)
    except (TypeError, RewardConfigError) as e:
        raise RewardConfigError(f"{where} ({fn}): {e}") from None
    correctness = isinstance(func, NamedReward) and func.correctness
    return Entry(RewardComponent(name=name, func=func, weight=float(weight)), correctness, decides)


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
