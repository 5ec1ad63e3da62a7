"""The named rewards' options (rewards/named.py's NAMED_REWARDS): one frozen dataclass per reward, each refusing a
bad value when made (RewardConfigError), and the helpers that check a config mapping's values against them
(`_fits`, `_type_name`) and name the nearest known name for a misspelt one (`nearest_name`).

`_validator` (a JSON Schema checked and compiled) lives here too: JsonSchemaOptions refuses a bad `schema` when made,
and json_schema's scorer (rewards/answer_scores.py) checks each row's `schema_column` with the same function.

Apart from named.py (the registry, the reward classes) so the pure scorers can take their options without the
registry: answer_scores.py imports this module, named.py imports both, and neither imports named.py. Building a
reward's options from a config mapping (`parse_options`) needs the registry, so it stays in named.py.
"""

from __future__ import annotations

import difflib
import math
import types
import typing
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from posttrain.errors import PosttrainError
from posttrain.rewards.extract import EXTRACTORS


class RewardConfigError(PosttrainError, ValueError):
    """A reward named in the config (or by `named_reward`) that cannot be built: an unknown name, a bad option."""


# ------------------------------------------------------------------------------------------------------- options


def _check_answer_format(answer_format: str) -> None:
    if answer_format not in EXTRACTORS:
        raise RewardConfigError(
            f"answer_format {answer_format!r} is not one of {', '.join(EXTRACTORS)}"
            + nearest_name(answer_format, EXTRACTORS)
        )


@dataclass(frozen=True)
class AnswerOptions:
    """What every answer-comparing reward takes: the gold column and how the answer is read from the text."""

    answer_column: str = "answer"
    answer_format: str = "auto"

    def __post_init__(self) -> None:
        _check_answer_format(self.answer_format)

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
        _positive(
            timeout_s=self.timeout_s, batch_timeout_s=self.batch_timeout_s, max_answer_chars=self.max_answer_chars
        )


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
        if (
            not self.letters
            or not all("A" <= c <= "Z" for c in self.letters)
            or len(set(self.letters)) != len(self.letters)
        ):
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
        _check_answer_format(self.answer_format)
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
        _check_answer_format(self.answer_format)
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
        _check_answer_format(self.answer_format)

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


def _validator(schema: Any, error: type[Exception]) -> Any:
    import jsonschema
    from jsonschema.validators import validator_for

    if not isinstance(schema, dict):
        raise error(f"a JSON Schema must be an object, got {type(schema).__name__}")
    cls = validator_for(schema)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as e:
        raise error(f"invalid JSON Schema: {e.message}") from None
    return cls(schema)


# ---------------------------------------------------------------------------------------- checking a config


def nearest_name(name: str, known: Iterable[str]) -> str:
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
