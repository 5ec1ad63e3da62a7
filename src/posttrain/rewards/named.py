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

`NAMED_REWARDS` is the registry (name -> RewardSpec: options dataclass, pure scoring function); `named_reward`
builds one, checking every option's name and type (RewardConfigError, with the nearest known name).
"""

from __future__ import annotations

import atexit
import dataclasses
import difflib
import math
import re
import threading
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal

from posttrain.bounded import BoundedError, loads_json
from posttrain.rewards.extract import EXTRACTORS, completion_text, extract_answer, has_answer
from posttrain.rewards.rubric import PartialRewardFailure


class RewardConfigError(ValueError):
    """A reward named in the config (or by `named_reward`) that cannot be built: an unknown name, a bad option."""


class GoldError(ValueError):
    """A row whose gold answer the reward cannot use (the data's fault, not the model's): that sample fails."""


# ------------------------------------------------------------------------------------------------------- options


@dataclass(frozen=True)
class AnswerOptions:
    """What every answer-comparing reward takes: the gold column and how the answer is read from the text."""

    answer_column: str = "answer"
    answer_format: str = "auto"

    def __post_init__(self) -> None:
        if self.answer_format not in EXTRACTORS:
            raise RewardConfigError(f"answer_format {self.answer_format!r} is not one of {', '.join(EXTRACTORS)}"
                                    + nearest_name(self.answer_format, EXTRACTORS))

    def columns(self) -> dict[str, str]:
        """option -> the row column it names (checked against the data before training)."""
        return {"answer_column": self.answer_column}


@dataclass(frozen=True)
class MathOptions(AnswerOptions):
    timeout_s: float = 2.0  # one answer's parse + verify; past it the answer scores 0 (and is counted)
    batch_timeout_s: float = 30.0  # one call's answers together; those left unchecked score 0 (counted)
    max_answer_chars: int = 1000  # a longer extracted answer scores 0 unparsed

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive(timeout_s=self.timeout_s, batch_timeout_s=self.batch_timeout_s,
                  max_answer_chars=self.max_answer_chars)


@dataclass(frozen=True)
class ExactOptions(AnswerOptions):
    strip: bool = True
    case_insensitive: bool = False
    normalize_whitespace: bool = True  # runs of whitespace compare as one space


@dataclass(frozen=True)
class NumericOptions(AnswerOptions):
    abs_tol: float = 1e-6
    rel_tol: float = 1e-6

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (self.abs_tol >= 0 and self.rel_tol >= 0 and math.isfinite(self.abs_tol + self.rel_tol)):
            raise RewardConfigError(f"abs_tol and rel_tol must be finite and >= 0, got {self.abs_tol}, {self.rel_tol}")


@dataclass(frozen=True)
class ContainsOptions(AnswerOptions):
    case_insensitive: bool = False


@dataclass(frozen=True)
class ChoiceOptions(AnswerOptions):
    letters: str = "ABCDEFGHIJ"  # the options' letters; a gold integer i is letters[i] (0-based, as MMLU's)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.letters or not all("A" <= c <= "Z" for c in self.letters) or len(set(self.letters)) != len(
                self.letters):
            raise RewardConfigError(f"letters must be distinct capital letters, got {self.letters!r}")


@dataclass(frozen=True)
class RegexOptions:
    pattern: str  # Python `regex` syntax; compiled once when the reward is built
    answer_format: str = "auto"
    ignore_case: bool = False
    fullmatch: bool = False  # the whole answer must match (default: the pattern anywhere in it)
    max_chars: int = 20_000  # the answer is cut to this before matching
    timeout_s: float = 1.0  # one match; past it the sample scores 0 (counted)

    def __post_init__(self) -> None:
        AnswerOptions.__post_init__(self)  # type: ignore[arg-type]
        _positive(max_chars=self.max_chars, timeout_s=self.timeout_s)

    def columns(self) -> dict[str, str]:
        return {}


@dataclass(frozen=True)
class JsonSchemaOptions:
    schema: dict | None = None  # a JSON Schema, or:
    schema_column: str | None = None  # the row column holding each row's schema (a dict or JSON text)
    answer_format: str = "auto"  # auto: <answer> tags, else the last ``` fenced block, else the whole text
    max_chars: int = 100_000

    def __post_init__(self) -> None:
        AnswerOptions.__post_init__(self)  # type: ignore[arg-type]
        _positive(max_chars=self.max_chars)
        if (self.schema is None) == (self.schema_column is None):
            raise RewardConfigError("json_schema needs exactly one of `schema` (a JSON Schema) or `schema_column`")
        if self.schema is not None:
            _validator(self.schema, RewardConfigError)

    def columns(self) -> dict[str, str]:
        return {"schema_column": self.schema_column} if self.schema_column else {}


@dataclass(frozen=True)
class FormatOptions:
    answer_format: str = "auto"  # the format required; auto: <answer> tags or a \boxed{}

    def __post_init__(self) -> None:
        AnswerOptions.__post_init__(self)  # type: ignore[arg-type]

    def columns(self) -> dict[str, str]:
        return {}


@dataclass(frozen=True)
class LengthOptions:
    target: int  # the length aimed at, in `unit`s
    unit: Literal["chars", "words", "tokens"] = "words"
    mode: Literal["at_most", "around"] = "at_most"  # at_most: shorter is fine; around: both sides cost
    tolerance: int | None = None  # how far from the target the score reaches 0 (default: the target)

    def __post_init__(self) -> None:
        _positive(target=self.target, **({} if self.tolerance is None else {"tolerance": self.tolerance}))

    def columns(self) -> dict[str, str]:
        return {}


def _positive(**values: float) -> None:
    for k, v in values.items():
        if not v > 0 or not math.isfinite(v):
            raise RewardConfigError(f"{k} must be > 0, got {v}")


# ------------------------------------------------------------------------------------------------ pure scoring

# Each scorer: (completion text, the row's columns it reads, options, prepared state) -> a score. Pure: the state is
# built once from the options (a compiled pattern, a schema validator) and never changed.


def _gold(row: dict[str, Any], column: str) -> Any:
    gold = row.get(column)
    if gold is None or (isinstance(gold, str) and not gold.strip()):
        raise GoldError(f"the row's {column!r} is empty: no gold answer to compare with")
    return gold


def _norm(s: str, o: ExactOptions | ContainsOptions) -> str:
    if getattr(o, "strip", True):
        s = s.strip()
    if getattr(o, "normalize_whitespace", True):
        s = " ".join(s.split())
    return s.casefold() if o.case_insensitive else s


def score_exact(text: str, row: dict[str, Any], o: ExactOptions, state: Any = None) -> float:
    """1.0 when the extracted answer equals the gold column's text (after strip / whitespace / case options)."""
    gold = str(_gold(row, o.answer_column))
    answer = extract_answer(text, o.answer_format)
    return float(answer is not None and _norm(answer, o) == _norm(gold, o))


def score_contains(text: str, row: dict[str, Any], o: ContainsOptions, state: Any = None) -> float:
    """1.0 when the gold column's text appears in the extracted answer (answer_format: none searches the whole
    completion)."""
    gold = _norm(str(_gold(row, o.answer_column)), o)
    answer = extract_answer(text, o.answer_format)
    return float(answer is not None and gold in _norm(answer, o))


_NUM = r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?(?:[eE][-+]?\d{1,3})?|[-+]?\.\d+(?:[eE][-+]?\d{1,3})?"
_WHOLE_NUMBER = re.compile(rf"({_NUM})(?:/({_NUM}))?(%)?")
_ANY_NUMBER = re.compile(rf"({_NUM})(?:\s*/\s*({_NUM}))?(\s*%)?")
_FRAC = re.compile(r"\\[dt]?frac\{([^{}]{1,40})\}\{([^{}]{1,40})\}")
_TEX_NOISE = re.compile(r"\\[,!;: ]|\\text\{\s*\}|\\left|\\right|\{,\}|\\\$|\$")
MAX_NUMBER_CHARS = 100  # digits past this are no answer anyone writes; float() on them is wasted work


def _value(num: str) -> Fraction | None:
    if len(num) > MAX_NUMBER_CHARS:
        return None
    try:
        f = float(num.replace(",", ""))
    except ValueError:
        return None
    return Fraction(f) if math.isfinite(f) else None


def _readings(m: re.Match[str]) -> list[float]:
    """The values a matched number may mean: a percent reads as both x/100 and x ("50%" is 0.5 or "50 percent")."""
    num, den = _value(m.group(1)), _value(m.group(2)) if m.group(2) else Fraction(1)
    if num is None or not den:
        return []
    v = float(num / den)
    return [v / 100, v] if m.group(3) else [v]


def parse_number(text: str) -> list[float]:
    """The readings of the number `text` states: what follows its last "=" if it has one ("3 + 4 = 7" -> 7), as one
    number if it is one ("1,234", "-3/4", "\\frac{3}{4}", "$5", "50\\%"), else the only number among words ("x is 12
    cm" -> 12). Empty when there is none or several ("10**10**10": an expression, not a number); never a non-finite
    value."""
    s = _FRAC.sub(r"\1/\2", text.replace("\\%", "%"))
    s = _TEX_NOISE.sub("", s).rsplit("=", 1)[-1].strip().rstrip(".")
    whole = _WHOLE_NUMBER.fullmatch(s.replace(" ", ""))
    if whole:
        return _readings(whole)
    found = []
    for m in _ANY_NUMBER.finditer(s):
        found.append(m)
        if len(found) > 1:
            return []
    return _readings(found[0]) if found else []


def score_numeric(text: str, row: dict[str, Any], o: NumericOptions, state: Any = None) -> float:
    """1.0 when the number in the extracted answer is within abs_tol / rel_tol of the gold number."""
    raw = _gold(row, o.answer_column)
    golds = [float(raw)] if isinstance(raw, (int, float)) and not isinstance(raw, bool) else parse_number(str(raw))
    golds = [g for g in golds if math.isfinite(g)]
    if not golds:
        raise GoldError(f"the row's {o.answer_column!r} ({str(raw)[:40]!r}) is not a number")
    answer = extract_answer(text, o.answer_format)
    got = parse_number(answer) if answer is not None else []
    return float(any(math.isclose(a, g, rel_tol=o.rel_tol, abs_tol=o.abs_tol) for a in got for g in golds))


def _choice_patterns(letters: str) -> list[re.Pattern[str]]:
    """Most explicit first. No two unbounded runs of the same characters sit side by side (linear on any text)."""
    L = f"([{re.escape(letters)}])"
    return [re.compile(rf"(?i:answer)(?:\s+(?i:is))?\s*(?:[:\-]\s*)?[(\[*]*{L}(?![A-Za-z])"),  # The answer is (C)
            re.compile(rf"\\boxed\{{{L}\}}"),  # \boxed{C}
            re.compile(rf"\*\*\(?{L}\)?\*\*"),  # **C** / **(C)**
            re.compile(rf"\({L}\)"),  # (C)
            re.compile(rf"(?:^|\s){L}[).:](?!\S)"),  # C) / C. / C: standing alone
            re.compile(rf"\W*{L}\W*")]  # the whole answer is the letter (fullmatch)


def choice_letter(text: str, letters: str = "ABCDEFGHIJ") -> str | None:
    """The option letter `text` picks, or None: "The answer is (C)", "Answer: C", "**C**", "(C)", "C)", "C"."""
    *found_in, whole = _choice_patterns(letters)
    for pattern in found_in:
        last = None
        for last in pattern.finditer(text):
            pass
        if last:
            return last.group(1)
    m = whole.fullmatch(text)
    return m.group(1) if m else None


def _gold_letter(raw: Any, o: ChoiceOptions) -> str:
    if isinstance(raw, int) and not isinstance(raw, bool) and 0 <= raw < len(o.letters):
        return o.letters[raw]
    s = str(raw).strip().strip("()").strip().upper()
    if len(s) != 1 or s not in o.letters:
        raise GoldError(f"the row's {o.answer_column!r} ({str(raw)[:40]!r}) is not one of the letters "
                        f"{o.letters} or an index 0-{len(o.letters) - 1}")
    return s


def score_choice(text: str, row: dict[str, Any], o: ChoiceOptions, state: Any = None) -> float:
    """1.0 when the option letter picked in the extracted answer is the gold letter (or gold index)."""
    gold = _gold_letter(_gold(row, o.answer_column), o)
    answer = extract_answer(text, o.answer_format)
    return float(answer is not None and choice_letter(answer, o.letters) == gold)


def _compile_regex(o: RegexOptions) -> Any:
    import regex

    try:
        return regex.compile(o.pattern, regex.IGNORECASE if o.ignore_case else 0)
    except regex.error as e:
        raise RewardConfigError(f"pattern {o.pattern!r} is not a valid regular expression: {e}") from None


def score_regex(text: str, row: dict[str, Any], o: RegexOptions, rx: Any) -> float:
    """1.0 when the extracted answer matches `pattern` (anywhere, or whole with fullmatch); the text is cut to
    max_chars and a match past timeout_s scores 0."""
    answer = extract_answer(text, o.answer_format)
    if answer is None:
        return 0.0
    match = rx.fullmatch if o.fullmatch else rx.search
    try:
        return float(match(answer[:o.max_chars], timeout=o.timeout_s) is not None)
    except TimeoutError:
        raise _Counted("timeouts", 0.0) from None


def _validator(schema: Any, error: type[Exception]) -> Any:
    import jsonschema

    if not isinstance(schema, dict):
        raise error(f"a JSON Schema must be an object, got {type(schema).__name__}")
    cls = jsonschema.validators.validator_for(schema)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as e:
        raise error(f"invalid JSON Schema: {e.message}") from None
    return cls(schema)


def json_text(text: str, how: str) -> str | None:
    """The JSON part of a completion. auto: <answer> tags, else the last ``` fenced block, else the whole text."""
    if how != "auto":
        return extract_answer(text, how)
    tagged = extract_answer(text, "answer_tag")
    if tagged is not None:
        return tagged
    close = text.rfind("```")
    start = text.rfind("```", 0, close) if close > 0 else -1
    if start >= 0:
        body = text[start + 3:close]
        first, nl, rest = body.partition("\n")
        return rest if nl and first.strip().isalnum() else body  # ```json\n{...}``` drops the language tag
    return text


def score_json_schema(text: str, row: dict[str, Any], o: JsonSchemaOptions, validator: Any) -> float:
    """1.0 when the answer parses as JSON (bounded: size, depth, no NaN) and validates against the schema."""
    if o.schema_column:
        schema = _gold(row, o.schema_column)
        if isinstance(schema, str):
            try:
                schema = loads_json(schema)
            except BoundedError as e:
                raise GoldError(f"the row's {o.schema_column!r} is not JSON: {e}") from None
        validator = _validator(schema, GoldError)
    raw = json_text(text, o.answer_format)
    if raw is None or len(raw) > o.max_chars:
        return 0.0
    try:
        value = loads_json(raw, max_chars=o.max_chars)
    except BoundedError:
        return 0.0
    return float(validator.is_valid(value))


def score_format(text: str, row: dict[str, Any], o: FormatOptions, state: Any = None) -> float:
    """1.0 when the completion gives its answer in the format asked for: answer_tag a closed <answer> tag, boxed a
    closed \\boxed{}, auto either of the two; the other formats need only an answer they can read."""
    return float(has_answer(text, o.answer_format))


def score_length(text: str, row: dict[str, Any], o: LengthOptions, state: Any = None) -> float:
    """1.0 at the target length (at_most: or under it), falling linearly to 0.0 `tolerance` units away."""
    if o.unit == "tokens":
        ids = row.get("completion_ids")
        if ids is None:
            raise GoldError("unit: tokens needs the completion's token ids, which this caller did not pass")
        n = len(ids)
    else:
        n = len(text) if o.unit == "chars" else len(text.split())
    over = max(n - o.target, 0) if o.mode == "at_most" else abs(n - o.target)
    return max(0.0, 1.0 - over / (o.tolerance or o.target))


class _Counted(Exception):
    """A scorer's way to say "this score, and count it under `key`" (a regex timeout)."""

    def __init__(self, key: str, value: float):
        super().__init__(key)
        self.key, self.value = key, value


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
        for i, (c, row) in enumerate(zip(completions, rows)):
            try:
                values.append(self.spec.score(completion_text(c), row, self.options, self.state()))  # type: ignore[misc]
            except _Counted as e:
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
    return (f"reward {name!r} ({fn}) reads the column {column!r}, which the rows do not have; their columns: "
            f"{', '.join(shown) or '(none)'}{nearest_name(column, shown)}")


# --------------------------------------------------------------------------------------------------------- math

MATH_MEMORY_BYTES = 1 << 30  # the checker's address space: a power tower needing more fails fast, not slowly
MATH_CPU_S = 3600  # the checker's own CPU over its life (it only forks and waits; each child has its batch's)
_MATH_WORKER = Path(__file__).with_name("_math_worker.py")
_MATH_POOL: Any = None
_MATH_POOL_LOCK = threading.Lock()


def math_pool() -> Any:
    """The process's math checkers (a bounded_regex.WorkerPool of rewards/_math_worker.py), made on first use."""
    global _MATH_POOL
    from posttrain.bounded_regex import WorkerPool

    with _MATH_POOL_LOCK:
        if _MATH_POOL is None:
            _MATH_POOL = WorkerPool(_MATH_WORKER, "math checker", size=2, memory_bytes=MATH_MEMORY_BYTES,
                                    cpu_s=MATH_CPU_S, wait_s=120.0)
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
                gold = str(_gold(row, o.answer_column))
            except GoldError as e:
                values[i], errors[i] = None, str(e)
                continue
            answer = extract_answer(completion_text(c), o.answer_format)
            if answer is not None and len(answer) <= o.max_answer_chars:
                items.append([gold[:o.max_answer_chars], answer])
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
            reply = math_pool().request({"items": items, "timeout": o.timeout_s, "budget": budget}, budget,
                                        64 + 16 * len(items), died="the math checker died")
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
    "regex": RewardSpec(RegexOptions, score_regex, True, _compile_regex),
    "choice": RewardSpec(ChoiceOptions, score_choice, True),
    "json_schema": RewardSpec(JsonSchemaOptions, score_json_schema, True,
                              lambda o: _validator(o.schema, RewardConfigError) if o.schema is not None else None),
    "format": RewardSpec(FormatOptions, score_format, False),
    "length": RewardSpec(LengthOptions, score_length, False),
}


# ------------------------------------------------------------------------------------------------ building them


def nearest_name(name: str, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(str(name), list(known), n=1, cutoff=0.5)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _type_name(hint: Any) -> str:
    args = typing.get_args(hint)
    if typing.get_origin(hint) is Literal:
        return " or ".join(repr(a) for a in args)
    if args:
        return " or ".join(_type_name(a) for a in args)
    return "null" if hint is type(None) else getattr(hint, "__name__", str(hint))


def _fits(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if origin is Literal:
        return value in typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, a) for a in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)


def parse_options(fn: str, raw: dict[str, Any]) -> Any:
    """The options dataclass of reward `fn` from a config mapping: every key known, every value of its type
    (an int where a float is asked is fine; true is never a number), required ones present."""
    cls = NAMED_REWARDS[fn].options
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    for key, value in raw.items():
        if key not in fields:
            raise RewardConfigError(f"{fn} has no option {key!r}{nearest_name(key, list(fields))}; its options: "
                                    f"{', '.join(fields)}")
        if not _fits(value, hints[key]):
            raise RewardConfigError(f"{fn} option {key!r} must be {_type_name(hints[key])}, got "
                                    f"{type(value).__name__} {value!r}")
    missing = [k for k, f in fields.items() if k not in raw and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]
    if missing:
        raise RewardConfigError(f"{fn} needs option {missing[0]!r}")
    converted = {k: float(v) if hints[k] is float else v for k, v in raw.items()}
    try:
        return cls(**converted)
    except RewardConfigError as e:
        raise RewardConfigError(f"{fn}: {e}") from None


def takes_answer_format(fn: str) -> bool:
    return any(f.name == "answer_format" for f in dataclasses.fields(NAMED_REWARDS[fn].options))


def named_reward(fn: str, name: str | None = None, **options: Any) -> NamedReward:
    """The reward `fn` of NAMED_REWARDS with `options` (checked), as a TRL reward function named `name` (default:
    fn). E.g. in a task file: `rewards=[named_reward("math", answer_column="solution"), my_style_reward]`."""
    if fn not in NAMED_REWARDS:
        raise RewardConfigError(f"unknown reward {fn!r}{nearest_name(fn, list(NAMED_REWARDS))}; known: "
                                f"{', '.join(NAMED_REWARDS)}")
    return NAMED_REWARDS[fn].reward(fn=fn, options=parse_options(fn, options), name=name or fn)
