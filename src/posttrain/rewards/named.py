"""Rewards by name: the checks the field trains on, ready to put in a config (`task.rewards=[{fn: math}]`) or in a
task file (`named_reward("math", answer_column="solution")`).

Each is a TRL reward function, `fn(completions, **columns) -> list[float | None]`: completions are strings or chat
message lists (the last message is read), columns are the rows' other columns as lists. Each reads the model's
answer through ONE step, `rewards/extract.py` (`answer_format`: auto, answer_tag, boxed, last_line, last_number,
none; default the task's `task.answer_format`), and compares it with a gold column (`answer_column`, default
`answer`).

    correctness (1.0 right, 0.0 wrong; the first of these decides a dataset task's pass)
      math         math-verify: fractions, decimals, LaTeX, \\boxed{}, percentages, units where it reads them;
                   run in a worker process, each answer within `timeout_s` (a timeout scores 0 and is counted)
      exact        string equality (strip, case_insensitive, normalize_whitespace)
      numeric      numbers within abs_tol / rel_tol ("1,234", "3/4", "\\frac{3}{4}", "50%", "-.5", "1e3")
      contains     the gold text appears in the answer
      regex        the answer matches a pattern from the config (search, or fullmatch)
      choice       a multiple-choice letter (A-J): "The answer is (C)", "C)", "**C**", "\\boxed{C}"
      json_schema  the answer is JSON that validates against a schema (config `schema` or a `schema_column`)
    shaping (only shape the reward)
      format       the answer is given in the format asked for (answer tags, \\boxed{})
      length       1.0 within a target length, falling linearly to 0.0 beyond it

`NAMED_REWARDS` is the registry (name -> RewardSpec: options model, pure scoring function); `named_reward`
builds one, its options checked by their model (config/reward_options.py: RewardConfigError, with the nearest known
name).

This module holds the reward classes (NamedReward, MathReward and its worker pool), the registry and the building;
the options models are config/reward_options.py's (re-exported by rewards/named_options.py), the pure scoring
functions in rewards/answer_scores.py. The names callers import from here (`__all__`) all still come from here,
those two modules' among them, re-exported.
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posttrain.config.reward_options import (
    ChoiceOptions,
    ContainsOptions,
    EntryError,
    ExactOptions,
    FormatOptions,
    JsonSchemaOptions,
    LengthOptions,
    MathOptions,
    NumericOptions,
    RegexOptions,
    options_of,
    schema_validator,
    takes_answer_format,
)
from posttrain.rewards.answer_scores import (
    CountedScore,
    GoldError,
    compile_regex,
    gold_answer,
    score_choice,
    score_contains,
    score_exact,
    score_format,
    score_json_schema,
    score_length,
    score_numeric,
    score_regex,
)
from posttrain.rewards.extract import completion_text, extract_answer
from posttrain.rewards.named_options import RewardConfigError, nearest_name
from posttrain.rewards.rubric import PartialRewardFailure

__all__ = [
    "NAMED_REWARDS",
    "GoldError",
    "MathReward",
    "NamedReward",
    "RewardConfigError",
    "RewardSpec",
    "math_pool",
    "missing_column_message",
    "named_reward",
    "nearest_name",
    "parse_options",
    "takes_answer_format",
]


# ------------------------------------------------------------------------------------------ the reward functions


@dataclass
class NamedReward:
    """A named reward as a TRL reward function. `columns()` names the row columns it reads (checked against the
    data when the task is built); `drain_metrics()` gives its counters (timeouts) to the step's metrics."""

    fn: str
    options: Any
    name: str
    _state: Any = field(default=None, repr=False)
    _counts: dict[str, int] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        self.__name__ = self.name
        self.__doc__ = getattr(self.spec.score, "__doc__", None) or type(self).__doc__
        self.state()  # a bad pattern or schema is refused now, not at the first score

    @property
    def spec(self) -> RewardSpec:
        return NAMED_REWARDS[self.fn]

    @property
    def correctness(self) -> bool:
        return self.spec.correctness

    def columns(self) -> dict[str, str]:
        return self.options.columns()

    def state(self) -> Any:
        if self._state is None and self.spec.prepare is not None:
            self._state = self.spec.prepare(self.options)
        return self._state

    def count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self._counts[key] = self._counts.get(key, 0) + n

    def drain_metrics(self) -> dict[str, float]:
        with self._lock:
            counts, self._counts = self._counts, {}
        return {f"reward/{self.name}/{k}": float(v) for k, v in counts.items()}

    def _rows(self, n: int, columns: dict[str, list[Any]], extra: Sequence[str] = ()) -> list[dict[str, Any]]:
        needed = list(self.columns().values()) + [c for c in extra if c in columns]
        missing = [c for c in self.columns().values() if c not in columns]
        if missing:
            raise ValueError(missing_column_message(self.name, self.fn, missing[0], list(columns)))
        return [{c: columns[c][i] for c in needed} for i in range(n)]

    def __call__(self, completions: list[Any], **columns: list[Any]) -> list[float | None]:
        rows = self._rows(len(completions), columns, ["completion_ids"])
        values: list[float | None] = []
        errors: dict[int, str] = {}
        score = self.spec.score
        assert score is not None  # a reward without a per-sample scorer has its own __call__ (MathReward)
        for i, (c, row) in enumerate(zip(completions, rows)):
            try:
                values.append(score(completion_text(c), row, self.options, self.state()))
            except CountedScore as e:
                self.count(e.key)
                values.append(e.value)
            except GoldError as e:
                values.append(None)
                errors[i] = str(e)
        if errors:
            raise PartialRewardFailure(values, errors)
        return values

    def __getstate__(self) -> dict[str, Any]:
        # A lock does not pickle, nor does a jsonschema validator: both are made again where it lands (Ray workers).
        d = dict(self.__dict__)
        d.update(_lock=None, _state=None)
        return d

    def __setstate__(self, d: dict[str, Any]) -> None:
        self.__dict__.update(d)
        self._lock = threading.Lock()


def missing_column_message(name: str, fn: str, column: str, there: Sequence[str]) -> str:
    shown = [c for c in there if c not in ("prompts", "completion_ids")]
    return (
        f"reward {name!r} ({fn}) reads the column {column!r}, which the rows do not have; their columns: "
        f"{', '.join(shown) or '(none)'}{nearest_name(column, shown)}"
    )


# --------------------------------------------------------------------------------------------------------- math

MATH_MEMORY_BYTES = 1 << 30  # the checker's address space: a power tower needing more fails fast, not slowly
MATH_CPU_S = 3600  # the checker's own CPU over its life (it only forks and waits; each child has its batch's)
_MATH_WORKER = Path(__file__).with_name("_math_worker.py")
_MATH_POOL: Any = None
_MATH_POOL_LOCK = threading.Lock()


def math_pool() -> Any:
    """The process's math checkers (a worker_pool.WorkerPool of rewards/_math_worker.py), made on first use."""
    global _MATH_POOL
    from posttrain.worker_pool import WorkerPool

    with _MATH_POOL_LOCK:
        if _MATH_POOL is None:
            _MATH_POOL = WorkerPool(
                _MATH_WORKER, "math checker", size=2, memory_bytes=MATH_MEMORY_BYTES, cpu_s=MATH_CPU_S, wait_s=120.0
            )
            atexit.register(_MATH_POOL.close)
        return _MATH_POOL


@dataclass
class MathReward(NamedReward):
    """1.0 when math-verify finds the extracted answer equal to the gold answer (fractions, decimals, LaTeX,
    \\boxed{}, percentages, units where math-verify reads them), else 0.0. Checked in a worker process: an answer
    that takes longer than timeout_s (a power tower sympy would evaluate for hours) scores 0 and is counted
    (`reward/<name>/timeouts`), as are answers left unchecked when the call passes batch_timeout_s."""

    def __post_init__(self) -> None:
        import importlib.util

        if importlib.util.find_spec("math_verify") is None:  # the worker would only say it did not start
            raise RewardConfigError("the math reward needs math-verify: pip install 'posttrain[math]'")
        super().__post_init__()

    def __call__(self, completions: list[Any], **columns: list[Any]) -> list[float | None]:
        o: MathOptions = self.options
        rows = self._rows(len(completions), columns)
        values: list[float | None] = [0.0] * len(completions)
        errors: dict[int, str] = {}
        items, where = [], []
        for i, (c, row) in enumerate(zip(completions, rows)):
            try:
                gold = str(gold_answer(row, o.answer_column))
            except GoldError as e:
                values[i], errors[i] = None, str(e)
                continue
            answer = extract_answer(completion_text(c), o.answer_format)
            if answer is not None and len(answer) <= o.max_answer_chars:
                items.append([gold[: o.max_answer_chars], answer])
                where.append(i)
            elif answer is not None:
                self.count("too_long")
        for i, r in zip(where, self._check(items)):
            if r == "gold":
                values[i], errors[i] = None, f"math-verify cannot read the row's {o.answer_column!r} as math"
            elif r in ("timeout", "error"):
                self.count(r + "s")
            else:
                values[i] = float(r == 1)
        self.count("checked", len(items))
        if errors:
            raise PartialRewardFailure(values, errors)
        return values

    def _check(self, items: list[list[str]]) -> list[Any]:
        """The checker's verdicts, one per item: 1, 0, "timeout", "gold" or "error"."""
        if not items:
            return []
        o: MathOptions = self.options
        budget = min(o.batch_timeout_s, o.timeout_s * len(items) + 1.0)
        from posttrain.bounded import BoundedTimeout

        try:
            reply = math_pool().request(
                {"items": items, "timeout": o.timeout_s, "budget": budget},
                budget,
                64 + 16 * len(items),
                died="the math checker died",
            )
        except BoundedTimeout:  # the checker itself missed its deadline: nothing was checked in time
            return ["timeout"] * len(items)
        results = reply.get("results")
        if not isinstance(results, list) or len(results) != len(items):
            raise RuntimeError(f"the math checker sent a bad reply: {str(reply)[:200]}")
        return results


# -------------------------------------------------------------------------------------------------- the registry


@dataclass(frozen=True)
class RewardSpec:
    options: type
    score: Callable[..., float] | None  # per sample; None: the reward class scores a whole batch itself
    correctness: bool  # may decide a task's pass (shaping terms only shape)
    prepare: Callable[[Any], Any] | None = None  # options -> state the scorer reads (built once, lazily)
    reward: type[NamedReward] = NamedReward  # the TRL-style callable built around it


NAMED_REWARDS: dict[str, RewardSpec] = {
    "math": RewardSpec(MathOptions, None, True, reward=MathReward),  # a batch per call, in the worker process
    "exact": RewardSpec(ExactOptions, score_exact, True),
    "numeric": RewardSpec(NumericOptions, score_numeric, True),
    "contains": RewardSpec(ContainsOptions, score_contains, True),
    "regex": RewardSpec(RegexOptions, score_regex, True, compile_regex),
    "choice": RewardSpec(ChoiceOptions, score_choice, True),
    "json_schema": RewardSpec(
        JsonSchemaOptions,
        score_json_schema,
        True,
        lambda o: schema_validator(o.schema, RewardConfigError) if o.schema is not None else None,
    ),
    "format": RewardSpec(FormatOptions, score_format, False),
    "length": RewardSpec(LengthOptions, score_length, False),
}


# ------------------------------------------------------------------------------------------------ building them


def parse_options(fn: str, raw: dict[str, Any]) -> Any:
    """The options of reward `fn` from a mapping, checked by its model (config/reward_options.py, the config's check
    of task.rewards too): every key known, every value of its type (an int where a float is asked is fine; true is
    never a number), required ones present."""
    try:
        return options_of(fn, raw)
    except EntryError as e:
        raise RewardConfigError(f"{fn} option {e}" if e.path else f"{fn}: {e.detail}") from None


def named_reward(fn: str, name: str | None = None, **options: Any) -> NamedReward:
    """The reward `fn` of NAMED_REWARDS with `options` (checked), as a TRL reward function named `name` (default:
    fn). E.g. in a task file: `rewards=[named_reward("math", answer_column="solution"), my_style_reward]`."""
    if fn not in NAMED_REWARDS:
        raise RewardConfigError(
            f"unknown reward {fn!r}{nearest_name(fn, list(NAMED_REWARDS))}; known: {', '.join(NAMED_REWARDS)}"
        )
    return NAMED_REWARDS[fn].reward(fn=fn, options=parse_options(fn, options), name=name or fn)
