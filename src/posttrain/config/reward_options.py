"""`task.rewards` entries as models: each named reward's options (rewards/named.py's NAMED_REWARDS take them as they
are: frozen pydantic dataclasses the scorers read), reward_model's and embedding_margin's, and what every entry
takes (`fn`, `weight`, `name`, `pass`). ONE check: `TaskConfig.rewards` runs it when the config is validated (the
run's start and `--dry-run` alike), rewards/from_config.py reads the entry it returns (`parse_entry`), and
`named_reward(...)` in a task file builds its options through the same models (`options_of`).

Data, so they live with the config (which imports no rewards); the scoring is rewards/answer_scores.py's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass as plain_dataclass
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, StrictBool, StrictStr, TypeAdapter, ValidationError, model_validator
from pydantic.dataclasses import dataclass

from posttrain.config.formats import AnswerFormat
from posttrain.config.task_options import describe, did_you_mean
from posttrain.errors import PosttrainError

# An unknown option is an error; so is a value of another type (true for a number, "yes" for true, 1 for text):
# strict per field, as a strict dataclass would take only an instance of itself.
_CONFIG = ConfigDict(extra="forbid")
Positive = Annotated[float, Field(gt=0, allow_inf_nan=False, strict=True)]
PositiveInt = Annotated[int, Field(gt=0, strict=True)]
NonNegative = Annotated[float, Field(ge=0, allow_inf_nan=False, strict=True)]


@dataclass(frozen=True, config=_CONFIG)
class AnswerOptions:
    """What every answer-comparing reward takes: the gold column and how the answer is read from the text."""

    answer_column: StrictStr = "answer"
    answer_format: AnswerFormat = "auto"

    def columns(self) -> dict[str, str]:
        """option -> the row column it names (checked against the data before training)."""
        return {"answer_column": self.answer_column}


@dataclass(frozen=True, config=_CONFIG)
class MathOptions(AnswerOptions):
    timeout_s: Positive = 2.0  # one answer's parse + verify; past it the answer scores 0 (and is counted)
    batch_timeout_s: Positive = 30.0  # one call's answers together; those left unchecked score 0 (counted)
    max_answer_chars: PositiveInt = 1000  # a longer extracted answer scores 0 unparsed


@dataclass(frozen=True, config=_CONFIG)
class ExactOptions(AnswerOptions):
    strip: StrictBool = True
    case_insensitive: StrictBool = False
    normalize_whitespace: StrictBool = True  # runs of whitespace compare as one space


@dataclass(frozen=True, config=_CONFIG)
class NumericOptions(AnswerOptions):
    abs_tol: NonNegative = 1e-6
    rel_tol: NonNegative = 1e-6


@dataclass(frozen=True, config=_CONFIG)
class ContainsOptions(AnswerOptions):
    case_insensitive: StrictBool = False


@dataclass(frozen=True, config=_CONFIG)
class ChoiceOptions(AnswerOptions):
    letters: StrictStr = "ABCDEFGHIJ"  # the options' letters; a gold integer i is letters[i] (0-based, as MMLU's)

    @model_validator(mode="after")
    def _distinct(self) -> ChoiceOptions:
        ok = self.letters and all("A" <= c <= "Z" for c in self.letters) and len(set(self.letters)) == len(self.letters)
        if not ok:
            raise ValueError(f"letters must be distinct capital letters, got {self.letters!r}")
        return self


@dataclass(frozen=True, config=_CONFIG, kw_only=True)
class RegexOptions:
    pattern: StrictStr  # Python `regex` syntax; compiled once when the reward is built
    answer_format: AnswerFormat = "auto"
    ignore_case: StrictBool = False
    fullmatch: StrictBool = False  # the whole answer must match (default: the pattern anywhere in it)
    max_chars: PositiveInt = 20_000  # the answer is cut to this before matching
    timeout_s: Positive = 1.0  # one match; past it the sample scores 0 (counted)

    def columns(self) -> dict[str, str]:
        return {}


@dataclass(frozen=True, config=_CONFIG)
class JsonSchemaOptions:
    schema: dict | None = None  # a JSON Schema, or:
    schema_column: StrictStr | None = None  # the row column holding each row's schema (a dict or JSON text)
    answer_format: AnswerFormat = "auto"  # auto: <answer> tags, else the last ``` fenced block, else the whole text
    max_chars: PositiveInt = 100_000

    @model_validator(mode="after")
    def _one_schema(self) -> JsonSchemaOptions:
        if (self.schema is None) == (self.schema_column is None):
            raise ValueError("json_schema needs exactly one of `schema` (a JSON Schema) or `schema_column`")
        if self.schema is not None:
            schema_validator(self.schema, ValueError)
        return self

    def columns(self) -> dict[str, str]:
        return {"schema_column": self.schema_column} if self.schema_column else {}


@dataclass(frozen=True, config=_CONFIG)
class FormatOptions:
    answer_format: AnswerFormat = "auto"  # the format required; auto: <answer> tags or a \boxed{}

    def columns(self) -> dict[str, str]:
        return {}


@dataclass(frozen=True, config=_CONFIG, kw_only=True)
class LengthOptions:
    target: PositiveInt  # the length aimed at, in `unit`s
    unit: Literal["chars", "words", "tokens"] = "words"
    mode: Literal["at_most", "around"] = "at_most"  # at_most: shorter is fine; around: both sides cost
    tolerance: PositiveInt | None = None  # how far from the target the score reaches 0 (default: the target)

    def columns(self) -> dict[str, str]:
        return {}


@dataclass(frozen=True, config=_CONFIG, kw_only=True)
class RewardModelOptions:
    """reward_model: a folder `posttrain rm train` wrote; unset keys keep rewards/reward_model.py's defaults."""

    path: StrictStr
    batch_size: PositiveInt | None = None
    device: StrictStr | None = None
    max_length: PositiveInt | None = None


@dataclass(frozen=True, config=_CONFIG)
class EmbeddingMarginOptions:
    """embedding_margin: unset keys keep rewards/embedding.py's defaults."""

    model: StrictStr | None = None
    device: StrictStr | None = None
    format_penalty: NonNegative | None = None


# The options model of every `fn` a task.rewards entry may name. Which are correctness rewards (may decide a
# dataset task's pass) is the registry's (rewards/named.py); a test holds the two lists of names equal.
OPTIONS: dict[str, type] = {
    "math": MathOptions,
    "exact": ExactOptions,
    "numeric": NumericOptions,
    "contains": ContainsOptions,
    "regex": RegexOptions,
    "choice": ChoiceOptions,
    "json_schema": JsonSchemaOptions,
    "format": FormatOptions,
    "length": LengthOptions,
    "reward_model": RewardModelOptions,
    "embedding_margin": EmbeddingMarginOptions,
}
_ADAPTERS = {fn: TypeAdapter(cls) for fn, cls in OPTIONS.items()}


@dataclass(frozen=True, config=ConfigDict(extra="allow"))
class _EntryKeys:
    """What every entry takes beside its reward's options."""

    fn: StrictStr
    weight: Annotated[float, Field(allow_inf_nan=False, strict=True)] = 1.0
    name: Annotated[str, Field(min_length=1, strict=True)] | None = None
    pass_: StrictBool = Field(default=False, alias="pass")  # true: this entry decides the pass


_ENTRY_KEYS = ("fn", "weight", "name", "pass")
_KEYS = TypeAdapter(_EntryKeys)


@plain_dataclass(frozen=True)
class RewardEntry:
    """One `task.rewards` entry, checked: its reward, weight, name, whether it decides the pass, and its options
    (the reward's options model; `answer_format` left unset when the entry did not set it: the task's applies)."""

    fn: str
    weight: float
    name: str
    decides: bool
    options: dict[str, Any]  # as given; checked by OPTIONS[fn] (with the task's answer_format where unset)


class EntryError(PosttrainError, ValueError):
    """A bad entry, as (the key path under the entry, what is wrong)."""

    def __init__(self, path: str, detail: str):
        super().__init__(f"{path}: {detail}" if path else detail)
        self.path, self.detail = path, detail


def _first(err: ValidationError, model: Any) -> tuple[str, str]:
    items = err.errors()
    unknown = ("extra_forbidden", "unexpected_keyword_argument")
    item = next((i for i in items if i["type"] in unknown), items[0])
    if item["type"] in unknown:  # an unknown option: the nearest, and the ones there are
        known = list(getattr(model, "__dataclass_fields__", {}))
        key = str(item["loc"][-1])
        return key, f"unknown option{did_you_mean(key, known)}; its options: {', '.join(known)}"
    line = describe(item)
    path, _, detail = line.partition(": ")
    return path, detail


def parse_entry(spec: Any) -> RewardEntry:
    """`spec` (one task.rewards mapping) checked: an EntryError naming the key and what is allowed otherwise."""
    if not isinstance(spec, dict):
        raise EntryError("", f"must be a mapping with `fn` (one of {', '.join(OPTIONS)}), got {spec!r:.120}")
    fn = spec.get("fn")
    if fn not in OPTIONS:
        got = "missing" if "fn" not in spec else f"{fn!r:.80} is not a reward"
        raise EntryError("fn", f"{got}{did_you_mean(fn, list(OPTIONS)) if fn else ''}; known: {', '.join(OPTIONS)}")
    try:
        keys = _KEYS.validate_python({k: spec[k] for k in _ENTRY_KEYS if k in spec})
    except ValidationError as e:
        raise EntryError(*_first(e, _EntryKeys)) from None
    options = {k: v for k, v in spec.items() if k not in _ENTRY_KEYS}
    options_of(fn, options)  # checked now; built again with the task's answer_format where the entry has none
    return RewardEntry(fn, float(keys.weight), str(keys.name or fn), keys.pass_, options)


def options_of(fn: str, options: dict[str, Any]) -> Any:
    """Reward `fn`'s options model from a mapping, or an EntryError naming the option and what is allowed."""
    try:
        return _ADAPTERS[fn].validate_python(options)
    except ValidationError as e:
        raise EntryError(*_first(e, OPTIONS[fn])) from None


def takes_answer_format(fn: str) -> bool:
    return "answer_format" in getattr(OPTIONS[fn], "__dataclass_fields__", {})


def schema_validator(schema: Any, error: Callable[[str], Exception]) -> Any:
    """A JSON Schema checked and compiled (its validator), or `error(message)` raised."""
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
