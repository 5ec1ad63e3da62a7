"""A weighted rubric of reward functions, with gates and per-component metrics.

Reward functions use TRL's signature, so TRL users bring theirs unchanged:

    def my_reward(completions, **kwargs) -> list[float | None]

`completions` are strings when the task's prompts are strings, and `[{"role": "assistant", "content": ...}]`
lists when the prompts are chat messages (TRL's conversational format). `kwargs` holds `prompts`,
`completion_ids` and every other column of the task rows, as lists aligned with `completions`.
`None` means "does not apply to this sample" and counts as 0 in the weighted sum. NaN or infinity is no score:
that sample fails with the reason, like a raise (never a silent 0 or an infinite reward).

A function that raises does not stop the run: the rubric retries it one sample at a time and marks only the
samples that still raise as failed (their error is kept, the trainer leaves them out, the loop counts them).
A function that knows which samples failed (an LLM judge whose call failed for some) raises
`PartialRewardFailure(values, errors)` instead: those samples fail at once, the others keep their values, and
nothing is called again.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
from dataclasses import dataclass, field
from typing import Any

from posttrain.rows import columns

RewardFunc = Callable[..., Sequence[float | None]]


@dataclass
class RewardComponent:
    """One rubric line.

    `gate`: name of another component that must pass (score >= its pass_threshold) for this one to count;
    a gated-out component scores 0. `pass_threshold`: score at which this component counts as passed
    (its pass rate is logged as `pass/<name>`).
    """

    name: str
    func: RewardFunc
    weight: float = 1.0
    gate: str | None = None
    pass_threshold: float = 1.0


@dataclass
class Score:
    reward: float
    components: dict[str, float]
    passed: bool
    failed: bool = False
    error: str | None = None


@dataclass
class Rubric:
    """Weighted sum of components. `pass_component` names the component whose pass defines a sample's
    overall pass (the headline pass rate); without one, a sample passes when every component passes."""

    components: list[RewardComponent]
    pass_component: str | None = None
    # Rubric-level gates (the watercolours recipe: a cheap check first): a sample that fails any of these components
    # gets a total reward of 0 and does not pass, and the components after the gate are not even called for it (a
    # judge or a reward model is never asked about a sample a regex already threw out).
    gates: list[str] = field(default_factory=list)
    normalize: bool = False  # divide the weighted sum by the sum of weights, so reward is in [0, 1]
    # Seconds one reward-function call may take. A call that runs past it marks its samples failed (counted,
    # logged) instead of hanging the run; Python cannot kill the stuck thread, so it is left to finish alone.
    timeout_s: float | None = 60.0
    _names: list[str] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        names = [c.name for c in self.components]
        if len(set(names)) != len(names):
            raise ValueError(f"reward component names must be unique, got {names}")
        for c in self.components:
            if c.gate is not None and c.gate not in names:
                raise ValueError(f"component {c.name!r} is gated on unknown component {c.gate!r}; known: {names}")
        if self.pass_component is not None and self.pass_component not in names:
            raise ValueError(f"pass_component {self.pass_component!r} is not a component; known: {names}")
        for g in self.gates:
            if g not in names:
                raise ValueError(f"gate {g!r} is not a component; known: {names}")
        self._names = names

    @classmethod
    def from_funcs(cls, funcs: Sequence[RewardFunc], weights: Sequence[float] | None = None) -> Rubric:
        weights = list(weights) if weights is not None else [1.0] * len(funcs)
        if len(weights) != len(funcs):
            raise ValueError(f"{len(funcs)} reward functions but {len(weights)} weights")
        comps = [
            RewardComponent(name=_func_name(f, i), func=f, weight=w) for i, (f, w) in enumerate(zip(funcs, weights))
        ]
        # The first function decides pass/fail; the rest shape the reward. Requiring every component to reach 1.0
        # would make a task with a penalty term (e.g. -0.05 per tool call) never pass.
        return cls(components=comps, pass_component=comps[0].name if comps else None)

    def score(self, completions: list[Any], rows: list[dict[str, Any]], **extra: list[Any]) -> list[Score]:
        """Score a batch. `rows` are the task rows (their columns become kwargs); `extra` adds more
        aligned lists (`prompts`, `completion_ids`)."""
        n = len(completions)
        kwargs = column_lists(rows)
        kwargs.update(extra)
        raw: dict[str, list[float | None]] = {}
        errors: list[str | None] = [None] * n
        for comp in self.components:
            todo = [i for i in range(n) if not self._gated_out(comp, raw, i)]
            if len(todo) == n:
                raw[comp.name] = _call_isolated(comp, completions, kwargs, n, errors, self.timeout_s)
                continue
            # Only the samples still past every gate already scored: the rest score 0 here anyway.
            sub_errors: list[str | None] = [errors[i] for i in todo]
            sub = (
                _call_isolated(
                    comp,
                    [completions[i] for i in todo],
                    {k: [v[i] for i in todo] for k, v in kwargs.items()},
                    len(todo),
                    sub_errors,
                    self.timeout_s,
                )
                if todo
                else []
            )
            raw[comp.name] = [None] * n
            for j, i in enumerate(todo):
                raw[comp.name][i], errors[i] = sub[j], sub_errors[j]
        scores = []
        for i in range(n):
            comps: dict[str, float] = {}
            total = 0.0
            for comp in self.components:
                v = _value(raw[comp.name][i])
                if comp.gate is not None:
                    gate = next(c for c in self.components if c.name == comp.gate)
                    if comps.get(gate.name, 0.0) < gate.pass_threshold:
                        v = 0.0
                comps[comp.name] = v
                total += comp.weight * v
            gated_out = any(comps[g] < self._threshold(g) for g in self.gates)
            if gated_out:
                total = 0.0
            if self.normalize:
                wsum = sum(abs(c.weight) for c in self.components) or 1.0
                total /= wsum
            if self.pass_component is not None:
                pc = next(c for c in self.components if c.name == self.pass_component)
                passed = comps[pc.name] >= pc.pass_threshold
            else:
                passed = all(comps[c.name] >= c.pass_threshold for c in self.components)
            failed = errors[i] is not None
            passed = passed and not gated_out
            scores.append(
                Score(
                    reward=0.0 if failed else total,
                    components=comps,
                    passed=passed and not failed,
                    failed=failed,
                    error=errors[i],
                )
            )
        return scores

    def _threshold(self, name: str) -> float:
        return next(c for c in self.components if c.name == name).pass_threshold

    def _gated_out(self, comp: RewardComponent, raw: dict[str, list[float | None]], i: int) -> bool:
        """True when a gate already scored (a rubric gate, or this component's own `gate`) failed for sample i."""
        gates = [g for g in self.gates if g != comp.name] + ([comp.gate] if comp.gate else [])
        return any(g in raw and _value(raw[g][i]) < self._threshold(g) for g in gates)

    def passes(self, name: str, value: float) -> bool:
        comp = next(c for c in self.components if c.name == name)
        return value >= comp.pass_threshold


def _value(v: float | None) -> float:
    """A raw component value as a number: None (does not apply, or failed) is 0. Never NaN: `_finite_only` has
    already failed the samples whose value was not finite."""
    return 0.0 if v is None else float(v)


def _func_name(f: RewardFunc, i: int) -> str:
    name = getattr(f, "__name__", None) or type(f).__name__
    return name if name != "<lambda>" else f"reward_{i}"


def column_lists(rows: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """The rows as TRL-style keyword columns: every key of any row (rows.columns), a value per row (None: absent).
    Rewards, feedback functions and the judge audit are called with these."""
    return {k: [r.get(k) for r in rows] for k in columns(rows)}


def _accepts(func: RewardFunc) -> tuple[set[str], bool]:
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError):
        return set(), True
    var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values())
    return set(sig.parameters), var_kw


def call_trl_style(func: Callable[..., Any], completions: list[Any], kwargs: dict[str, list[Any]]) -> list[Any]:
    """func(completions, **the columns it accepts), one output per completion."""
    names, var_kw = _accepts(func)
    kw = kwargs if var_kw else {k: v for k, v in kwargs.items() if k in names}
    out = list(func(completions, **kw))
    if len(out) != len(completions):
        raise ValueError(f"returned {len(out)} values for {len(completions)} completions")
    return out


def call_reward(func: RewardFunc, completions: list[Any], kwargs: dict[str, list[Any]]) -> list[float | None]:
    out = call_trl_style(func, completions, kwargs)
    for v in out:
        if v is not None and not isinstance(v, (int, float)):
            raise TypeError(f"returned a {type(v).__name__}, expected float or None")
    return out


def call_with_timeout(
    func: RewardFunc,
    completions: list[Any],
    kwargs: dict[str, list[Any]],
    timeout_s: float | None,
    call: Callable[..., list[Any]] | None = None,
) -> list[Any]:
    """`call(func, completions, kwargs)` (default: a reward call, checked for numbers) under a timeout."""
    call = call or call_reward
    if timeout_s is None:
        return call(func, completions, kwargs)
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reward")
    try:
        return pool.submit(call, func, completions, kwargs).result(timeout=timeout_s)
    except FuturesTimeout:
        raise RewardTimeout(f"took longer than {timeout_s:g}s") from None
    finally:
        pool.shutdown(wait=False)


class RewardTimeout(RuntimeError):
    pass


class PartialRewardFailure(RuntimeError):
    """Raised by a reward function that scored some samples and failed others: `values` holds one entry per
    completion (None where failed), `errors` the index -> message of each failed sample."""

    def __init__(self, values: list[float | None], errors: dict[int, str]):
        super().__init__(f"{len(errors)} of {len(values)} samples failed: {next(iter(errors.values()), '')}")
        self.values, self.errors = list(values), dict(errors)


def _call_isolated(
    comp: RewardComponent,
    completions: list[Any],
    kwargs: dict[str, list[Any]],
    n: int,
    errors: list[str | None],
    timeout_s: float | None = None,
) -> list[float | None]:
    """The component's values, each finite or None; the samples it could not score are marked in `errors`."""
    return _finite_only(comp, _call_each(comp, completions, kwargs, n, errors, timeout_s), errors)


def _finite_only(comp: RewardComponent, values: list[float | None], errors: list[str | None]) -> list[float | None]:
    """A NaN or infinite value is no score: that sample fails with the reason. Read as 0 it would be a silently
    wrong reward (a judge that broke scores like a bad answer), and an infinity would swamp its group's advantages."""
    out: list[float | None] = []
    for i, v in enumerate(values):
        if v is not None and not _is_finite(v):
            errors[i] = errors[i] or f"reward {comp.name!r} returned {v!r}, not a finite number"
            v = None
        out.append(v)
    return out


def _is_finite(v: Any) -> bool:
    try:
        return math.isfinite(v)
    except (OverflowError, TypeError, ValueError):  # an int too large for a float; not a number at all
        return False


def _call_each(
    comp: RewardComponent,
    completions: list[Any],
    kwargs: dict[str, list[Any]],
    n: int,
    errors: list[str | None],
    timeout_s: float | None = None,
) -> list[float | None]:
    """Call on the whole batch; if that raises, call per sample so one bad sample fails alone. A timeout
    fails the whole batch at once (retrying per sample could take n times the timeout)."""
    try:
        return call_with_timeout(comp.func, completions, kwargs, timeout_s)
    except RewardTimeout as e:
        for i in range(n):
            errors[i] = errors[i] or f"reward {comp.name!r} {e}"
        return [None] * n
    except PartialRewardFailure as e:
        if len(e.values) == n:
            for i, msg in e.errors.items():
                errors[i] = errors[i] or f"reward {comp.name!r} failed: {msg}"
            return [None if i in e.errors else v for i, v in enumerate(e.values)]
    except Exception:  # noqa: BLE001 - a user reward function may raise anything; we isolate it
        pass
    out: list[float | None] = []
    for i in range(n):
        try:
            out.append(
                call_with_timeout(
                    comp.func, completions[i : i + 1], {k: v[i : i + 1] for k, v in kwargs.items()}, timeout_s
                )[0]
            )
        except Exception as e:  # noqa: BLE001 - a user reward may raise anything: it fails this sample alone
            out.append(None)
            if errors[i] is None:
                errors[i] = f"reward {comp.name!r} raised {type(e).__name__}: {e}"
    return out
