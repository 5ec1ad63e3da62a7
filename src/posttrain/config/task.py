"""The `task:` section: a task of code by name, or one built from data (task.dataset), and its rewards."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from posttrain.config.formats import AnswerFormat
from posttrain.config.reward_options import EntryError, parse_entry
from posttrain.config.strict import Strict
from posttrain.config.task_options import check_options

# Keys that only mean something for a task built from data (task.dataset).
DATASET_KEYS = (
    "split",
    "prompt_column",
    "prompt_template",
    "system_prompt",
    "chat",
    "eval_split",
    "eval_fraction",
    "max_rows",
)


class TaskConfig(Strict):
    @field_validator("env_check", mode="before")
    @classmethod
    def _yaml_off(cls, v):
        # YAML reads a bare `off` as false (and `on` as true): accept what the user meant.
        return {False: "off", True: "refuse"}.get(v, v) if isinstance(v, bool) else v

    name: str = Field(
        default="json-extract", description="a built-in task name, 'path/file.py:make_task' or 'pkg.module:make_task'"
    )
    options: dict = Field(
        default_factory=dict,
        description=(
            "keyword arguments for the task factory; a mixture's, a reasoning-gym dataset's and a verifiers env's are "
            "checked here (config/task_options.py)"
        ),
    )
    rewards: list[dict] = Field(
        default_factory=list,
        description=(
            "rewards added to the task's rubric (a task.dataset task's only rewards), e.g. [{fn: math}] or "
            "[{fn: reward_model, path: DIR, weight: 1.0}]; fn: math, exact, numeric, contains, regex, choice, "
            "json_schema, format, length (docs/datasets.md), reward_model or embedding_margin (docs/reward_models.md); "
            "each entry takes weight, name, pass (true: it decides the pass) and the reward's options"
        ),
    )
    answer_format: AnswerFormat = Field(
        default="auto",
        description=(
            "how the named rewards read the answer from a completion (rewards/extract.py): auto (<answer> tags, else "
            "the last \\boxed{}, else the last line), answer_tag, boxed, last_line, last_number or none (the whole "
            "text); an entry's own answer_format wins"
        ),
    )
    dataset: str | None = Field(
        default=None,
        description=(
            "build the task from data instead of task.name: a local .jsonl, .json, .parquet, .csv or .arrow file, a "
            "folder of such files named by split (train.jsonl, test.parquet), a `datasets` save_to_disk folder, or a "
            "dataset name in the local Hugging Face cache (never downloaded); needs task.rewards (docs/datasets.md)"
        ),
    )
    split: str = Field(default="train", description="task.dataset: the split trained on")
    prompt_column: str = Field(
        default="prompt",
        description=("task.dataset: the column holding the prompt, a string or a list of chat messages"),
    )
    prompt_template: str | None = Field(
        default=None,
        description=(
            "task.dataset: build the prompt from the row's columns instead, a Python format string such as "
            "'Solve: {question}' (literal braces doubled: \\boxed{{}})"
        ),
    )
    system_prompt: str | None = Field(
        default=None,
        description=(
            "task.dataset: a system message put before each prompt (a string prompt becomes a chat user message)"
        ),
    )
    chat: bool | None = Field(
        default=None,
        description=(
            "task.dataset: true: a string prompt becomes a chat user message, rendered with the model's chat template; "
            "null: as the data has it (a string is raw text, TRL's convention), unless system_prompt is set"
        ),
    )
    eval_split: str | None = Field(
        default=None,
        description=(
            "task.dataset: the split held out for evaluation (e.g. test); default: eval_fraction of the train split"
        ),
    )
    eval_fraction: float | None = Field(
        default=None,
        gt=0.0,
        lt=1.0,
        description=(
            "task.dataset: the share of the train split held out (seeded by run.seed); default: 10%, at most 64 rows"
        ),
    )
    max_rows: int | None = Field(
        default=None, ge=1, description="task.dataset: read at most this many rows of each split"
    )
    reward_timeout_s: float = Field(
        default=60.0,
        gt=0.0,
        description="seconds one reward-function call may take; past it the samples count as failed",
    )
    max_observation_chars: int | None = Field(
        default=None,
        ge=1,
        description=(
            "multi-turn tasks: the most characters of one tool result or env observation the model reads back (the "
            "rest cut with a marker); default: the task's own (8000 unless it says); docs/limits.md"
        ),
    )
    tool_parser: Literal["auto", "hermes", "llama3", "mistral", "qwen3_coder"] | None = Field(
        default=None,
        description=(
            "tool and agent tasks: how tool calls are read from the policy's replies (sampling/tool_parsers.py): auto "
            "(the chat template's family), hermes (<tool_call> JSON), llama3, mistral, qwen3_coder; the tool env also "
            "reads the <tool_call> JSON its own prompt asks for; default: the task's own (auto); docs/serving.md"
        ),
    )
    reasoning_parser: Literal["auto", "think", "mistral", "none"] | None = Field(
        default=None,
        description=(
            "tool and agent tasks: the policy's reasoning block, never read for tool calls and served as "
            "reasoning_content: auto (the chat template's family), think (<think>...</think>), mistral "
            "([THINK]...[/THINK]), none; default: the task's own (auto)"
        ),
    )
    thinking: Literal["split", "keep"] | None = Field(
        default=None,
        description=(
            "tool and agent tasks, thinking models whose chat template drops earlier turns' reasoning: split (train "
            "each context the model was given; a new chain where the template drops reasoning) or keep (render every "
            "turn's reasoning with a variant of the template, for sampling and training; refused when the template "
            "has none); default: the task's own (split); docs/agents.md"
        ),
    )
    subset: str | None = Field(
        default=None,
        description=(
            'a JSON file {"train": [row indices], "eval": [row indices]} keeping only those rows of the task, e.g. '
            "the rows where the model's pass@16 is 0 (bench/feedback.py select writes one)"
        ),
    )
    env_check: Literal["refuse", "warn", "off"] = Field(
        default="refuse",
        description="run the task's smoke checks before training (posttrain env check); on failure refuse or warn",
    )

    @field_validator("rewards")
    @classmethod
    def _rewards(cls, v: list[dict]) -> list[dict]:
        # The models rewards/from_config.py builds the entries with (config/reward_options.py): one check.
        for i, spec in enumerate(v):
            try:
                parse_entry(spec)
            except EntryError as e:
                raise PydanticCustomError(
                    "option_error",
                    "{path}: {detail}",
                    {"path": f"[{i}].{e.path}" if e.path else f"[{i}]", "detail": e.detail},
                ) from None
        return v

    @model_validator(mode="after")
    def _options(self) -> TaskConfig:
        # The same model the task's loader reads (tasks/mixture.py, reasoning_gym.py, verifiers_task.py).
        check_options(self.name, self.options)
        return self

    @model_validator(mode="after")
    def _dataset_keys(self) -> TaskConfig:
        # Compared with the defaults, not model_fields_set: a run's config.yaml (resume) sets every key.
        changed = [k for k in ("name", *DATASET_KEYS) if getattr(self, k) != type(self).model_fields[k].default]
        if self.dataset is None:
            stray = [k for k in changed if k != "name"]
            if stray:
                raise ValueError(f"task.{stray[0]} is for a task built from data: set task.dataset too")
            return self
        if "name" in changed or self.options:
            raise ValueError(
                "task.dataset builds the task from data; task.name / task.options name a task of code: "
                "set one or the other"
            )
        if self.eval_split is not None and self.eval_fraction is not None:
            raise ValueError(
                "set task.eval_split (a split of the data) or task.eval_fraction (a share of the train split), not both"
            )
        return self

    @property
    def label(self) -> str:
        """What the task is called in run names: the data's file or dataset name, else task.name."""
        if self.dataset is None:
            return self.name
        from pathlib import PurePath

        return PurePath(self.dataset.rstrip("/")).stem or "dataset"
