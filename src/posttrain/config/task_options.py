"""The options of the task kinds posttrain reads itself (a mixture, a reasoning-gym dataset, a verifiers env) and of
an eval-suite task, as models: ONE check, run when the config is validated (so `--dry-run` and the run's start
refuse the same values) and again by the task that reads them (`parse`, for a task loaded without a config).

`task.options` stays a mapping (any task's factory takes its own keywords); `check_options(name, options)` checks it
against the model `name` picks (`model_for`), and the task's loader reads that model (`parse`). A bad value is one
line naming its key path and what is allowed (`describe`), with the nearest known name where there is one.
"""

from __future__ import annotations

import difflib
from typing import Any, TypeVar, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from posttrain.config.formats import AnswerFormat
from posttrain.config.strict import Strict
from posttrain.errors import PosttrainError

M = TypeVar("M", bound=BaseModel)


class OptionsError(PosttrainError, ValueError):
    """A task's options that a model refuses: the key path, what was given, what is allowed."""

    fix = "see the task's page under docs/ for its options"


# ------------------------------------------------------------------------------------------ one line per error


def _dotted(loc: tuple[Any, ...] | list[Any]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _join(where: str, path: str) -> str:
    if not path or not where:
        return where or path
    return where + path if path.startswith("[") else f"{where}.{path}"


def did_you_mean(name: Any, known: list[str]) -> str:
    """' (did you mean 'x'?)' for the known name nearest `name`, or ''; reward_options words its errors the same."""
    close = difflib.get_close_matches(str(name), known, n=1, cutoff=0.5)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _model_at(model: type[BaseModel] | None, loc: list[Any]) -> type[BaseModel] | None:
    """The model at `loc` under `model` (through lists and optionals), or None."""
    for part in loc:
        if model is None:
            return None
        if isinstance(part, int):
            continue
        field = model.model_fields.get(str(part))
        types = [field.annotation, *_args(field.annotation)] if field is not None else []
        model = next((t for t in types if isinstance(t, type) and issubclass(t, BaseModel)), None)
    return model


def _args(tp: Any) -> list[Any]:
    out = []
    for a in get_args(tp):
        out += [a, *_args(a)]
    return out


def _first(err: ValidationError) -> Any:
    """The error said: an unknown key before what it leaves missing (a misspelt key is both)."""
    items = err.errors()
    return next((i for i in items if i["type"] == "extra_forbidden"), items[0])


def _path_and_detail(item: Any, model: type[BaseModel] | None = None) -> tuple[str, str]:
    """(the key path, what is wrong there) of one pydantic error; `model`: the model validated, for the known keys
    of an unknown top-level one."""
    loc, ctx = list(item["loc"]), item.get("ctx") or {}
    if item["type"] == "option_error":  # a nested task's options, already worded (check_options)
        return _join(_dotted(loc), ctx["path"]), ctx["detail"]
    if item["type"] == "extra_forbidden":
        at = _model_at(model, loc[:-1])
        known = list(at.model_fields) if at is not None else []
        tail = f"{did_you_mean(loc[-1], known)}; known: {', '.join(known)}" if known else ""
        return _dotted(loc), f"unknown key{tail}"
    msg = str(item["msg"]).removeprefix("Value error, ")
    near = ""
    if item["type"] == "literal_error":
        known = [a.strip().strip("'") for a in str(ctx.get("expected", "")).replace(" or ", ", ").split(", ")]
        near = did_you_mean(item.get("input"), known) if isinstance(item.get("input"), str) else ""
    elif item["type"] == "union_tag_invalid":
        near = did_you_mean(
            ctx.get("tag"), [t.strip().strip("'") for t in str(ctx.get("expected_tags", "")).split(", ")]
        )
    # The value given, unless the key is missing or the value is a whole section (its keys are named by the path).
    shown = "input" in item and item["type"] != "missing" and not isinstance(item["input"], dict)
    got = f"{item['input']!r:.120}: " if shown else ""
    return _dotted(loc), f"{got}{msg}{near}"


def describe(item: Any, where: str = "", model: type[BaseModel] | None = None) -> str:
    """One pydantic error (an item of `ValidationError.errors()`) as one line: the key path under `where`, the
    value given, what is allowed, and the nearest known name for a misspelt one."""
    path, detail = _path_and_detail(item, model)
    return f"{_join(where, path)}: {detail}"


def parse(model: type[M], options: dict[str, Any] | None, where: str) -> M:
    """`options` as `model`, or an OptionsError naming the first bad value under `where` (e.g. task.options)."""
    try:
        return model.model_validate(dict(options or {}))
    except ValidationError as e:
        raise OptionsError(describe(_first(e), where, model)) from None


def _nested(model: type[BaseModel], options: Any, path: str) -> None:
    """`options` checked against `model` inside another model's validator: the error keeps its own path (under
    `path`, the field being validated) and wording; pydantic puts the outer path before it."""
    try:
        model.model_validate(options if options is not None else {})
    except ValidationError as e:
        sub, detail = _path_and_detail(_first(e), model)
        raise PydanticCustomError(
            "option_error", "{path}: {detail}", {"path": _join(path, sub), "detail": detail}
        ) from None


def model_for(name: str) -> type[BaseModel] | None:
    """The options model of the task `name` names, or None for a task whose factory takes its own keywords."""
    if name == "mixture":
        return MixtureOptions
    if name.startswith("reasoning_gym:"):
        return ReasoningGymOptions
    if name.startswith("verifiers:"):
        return VerifiersOptions
    return None


def check_options(name: Any, options: Any, path: str = "options") -> None:
    """Inside a validator: `options` checked against the model of task `name` (an option_error otherwise)."""
    model = model_for(name) if isinstance(name, str) else None
    if model is not None:
        _nested(model, options, path)


# --------------------------------------------------------------------------------------------------- mixtures


class MixturePart(Strict):
    """One task of a mixture (tasks/mixture.py)."""

    name: str = Field(description="any task name load_task knows")
    options: dict = Field(default_factory=dict, description="the part's task options")
    weight: float = Field(default=1.0, gt=0, allow_inf_nan=False, description="its share of the training prompts")
    max_tokens: int | None = Field(default=None, ge=1, description="else the task's own, else the run's")
    stop: list[str] | None = Field(default=None, description="else the task's own, else the run's")
    label: str | None = Field(default=None, description="its name in the mixture (default: name)")

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    @model_validator(mode="after")
    def _own_options(self) -> MixturePart:
        check_options(self.name, self.options)
        return self

    @property
    def key(self) -> str:
        return self.label or self.name


class MixtureOptions(Strict):
    """`task.options` of `task.name=mixture`."""

    tasks: list[MixturePart] = Field(min_length=1, description="the parts, e.g. [{name: count-a, weight: 2}]")
    seed: int | None = Field(default=None, description="the training rows' draw; default run.seed")

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="after")
    def _unique(self) -> MixtureOptions:
        names = [p.key for p in self.tasks]
        if len(set(names)) != len(names):
            raise ValueError(f"task names must be unique, got {names} (give a repeated task a `label`)")
        return self


# ---------------------------------------------------------------------------------------------- reasoning-gym


class ReasoningGymOptions(BaseModel):
    """`task.options` of `task.name=reasoning_gym:<dataset>`: posttrain's own keys; every other key is the
    dataset's config (`model_extra`, checked against reasoning-gym's config class when the dataset is built)."""

    model_config = ConfigDict(extra="allow", strict=True, frozen=True)

    train_size: int = Field(default=1000, ge=1, description="training rows (`size` is an alias)")
    eval_size: int = Field(default=64, ge=0, description="held-out rows")
    seed: int = Field(default=0, ge=0, description="seeds the dataset")
    system_prompt: str | None = None
    answer_format: AnswerFormat = "answer_tag"
    fallback: bool = True
    max_tokens: int = Field(default=256, ge=1)
    format_weight: float = Field(default=0.1, ge=0, allow_inf_nan=False)
    score_timeout_s: float = Field(default=5.0, gt=0, allow_inf_nan=False)
    datasets: dict | list | None = Field(default=None, description="composite: the datasets and their weights")

    @model_validator(mode="before")
    @classmethod
    def _size(cls, data: Any) -> Any:
        if isinstance(data, dict) and "size" in data:  # reasoning-gym's name for it
            if "train_size" in data:
                raise ValueError("give train_size or size, not both")
            data = {k: v for k, v in data.items() if k != "size"} | {"train_size": data["size"]}
        return data

    @property
    def config(self) -> dict[str, Any]:
        """The dataset's config: every key that is not posttrain's (with `datasets` for composite)."""
        extra = dict(self.model_extra or {})
        return extra | ({"datasets": self.datasets} if self.datasets is not None else {})


# -------------------------------------------------------------------------------------------------- verifiers


class VerifiersOptions(BaseModel):
    """posttrain's own keys of `task.options` for `task.name=verifiers:...`; every other key is the verifiers
    env's config (`model_extra`), passed to verifiers as it is."""

    model_config = ConfigDict(extra="allow", frozen=True)

    n_train: int | None = Field(default=None, ge=1, description="tasks trained on (an infinite taskset needs it)")
    n_eval: int | None = Field(default=None, ge=0, description="tasks held out (default 10%, at most 64)")
    eval: dict | None = Field(default=None, description="options for the held-out tasks' env, merged over the rest")
    max_tokens: int | None = Field(default=None, ge=1)
    timeout_s: float = Field(default=300.0, gt=0, allow_inf_nan=False, description="one episode")
    request_timeout_s: float = Field(default=120.0, gt=0, allow_inf_nan=False, description="one model call")
    max_turns: int = Field(default=16, ge=1, description="model calls per seat where the env sets no limit")
    max_observation_chars: int | None = Field(
        default=None, ge=1, description="of one env message; default task.max_observation_chars, else 8000"
    )
    pass_reward: str | None = None
    episode_threads: int = Field(default=64, ge=1)
    max_stuck_threads: int = Field(default=8, ge=1)

    @field_validator(
        "n_train",
        "n_eval",
        "max_tokens",
        "max_turns",
        "episode_threads",
        "max_stuck_threads",
        "max_observation_chars",
        mode="before",
    )
    @classmethod
    def _no_bool(cls, v: Any) -> Any:
        if isinstance(v, bool):  # YAML's true is no count
            raise ValueError("must be an integer")
        return v

    @property
    def env_options(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


# ------------------------------------------------------------------------------------------------- eval suite


class SuiteTaskConfig(Strict):
    """One task of `eval_suite.tasks`."""

    name: str
    options: dict = Field(default_factory=dict)
    prompts: int | None = Field(default=None, ge=1, description="held-out prompts (default eval_suite.prompts)")

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    @model_validator(mode="after")
    def _own_options(self) -> SuiteTaskConfig:
        check_options(self.name, self.options)
        return self
