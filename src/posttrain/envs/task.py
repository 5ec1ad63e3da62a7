"""A Task: the prompts (train and held-out) and the rubric that scores completions.

A row is a dict with a `prompt` (a string, used as raw text, or a list of chat messages, rendered with the
model's chat template) and any other columns, which reward functions receive as keyword lists (TRL style).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from posttrain.errors import PosttrainError
from posttrain.rewards.rubric import Rubric


class TaskLoadError(PosttrainError, ValueError):
    """A task that cannot be loaded or built (a bad name, file or option); the CLI prints it as one line."""


@dataclass
class Task:
    name: str
    train_rows: list[dict[str, Any]]
    eval_rows: list[dict[str, Any]]
    rubric: Rubric
    description: str = ""
    # Sampling hints the task knows best (e.g. how long a good answer is); config values win when set.
    max_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    # Tool use: with tools, the loop runs a multi-turn ToolEnv (envs/tool_env.py) instead of one completion.
    tools: list[Callable[..., Any]] = field(default_factory=list)
    max_turns: int = 1
    final_tool: str | None = None  # calling this tool ends the episode; its first argument is the answer
    tool_timeout_s: float = 10.0
    # The most characters of one tool result or env observation the model reads back; the rest is cut with a marker
    # (bounded.truncate_text), before it is tokenized into the next turn's prompt.
    max_observation_chars: int = 8000
    # How the policy's replies are read (sampling/reply_parsers.py): its family's tool-call format (hermes, llama3,
    # mistral, qwen3_coder) and reasoning block (think, mistral, none); auto: read from the chat template.
    tool_parser: str = "auto"
    reasoning_parser: str = "auto"
    # A thinking model whose template drops earlier reasoning: "split" (new chain there) or "keep" (docs/agents.md).
    thinking: str = "split"
    # Tools with per-episode state: episode(row) -> an object whose `tools` serve one rollout only (e.g. bound to
    # that episode's own copy of a repo) and whose optional `finish(final_call)` reports metrics and reward
    # columns when it ends (envs/tool_env.py). `tools` above still lists the schemas shown in the prompt.
    episode: Callable[[dict[str, Any]], Any] | None = None
    # Any other environment: env_factory(task, tokenizer, sample_params) -> an Env (envs/base.py). Wins over tools.
    env_factory: Callable[..., Any] | None = None
    # Demonstrations for a supervised warm start (loop/warm_start.py, `warm_start.steps`): demonstrate(row) -> the
    # assistant replies for that row, one per turn, played through the env as a scripted policy. Replies are fixed
    # per row (they cannot read tool results), so a task whose right calls depend on what a tool returns writes
    # them from the row's own columns (search-qa knows each question's chain of entities).
    demonstrate: Callable[[dict[str, Any]], list[str]] | None = None
    # Known-good / known-bad answers and smoke commands (envs/smoke_checks.py SmokeCheck), run by `posttrain env check`
    # and before training (task.env_check). Empty: one check that scoring an empty completion does not raise.
    smoke_checks: list[Any] = field(default_factory=list)
    # Rewards relative to the other completions of the same prompt (a ranking judge, a tournament):
    # fn(completions_G, **columns) -> G scores, called once per group (envs/base.py score_groups).
    group_rewards: list[Callable[..., Any]] = field(default_factory=list)
    group_reward_weights: list[float] | None = None  # None: 1.0 each
    # LLM judges the task uses or offers, by name (rewards/judges/): `posttrain judge audit` audits them against
    # the rubric's pass component (the programmatic verifier), and their metrics join each step's.
    judges: dict[str, Any] = field(default_factory=dict)
    # Whether a training sample can pass at all. Label-free training (TTRL) has no headline on its training rows
    # (the labels are held out), so its train records carry no pass rate and the pass-based diagnostics skip it.
    train_pass: bool = True
    # What went wrong, in words, for samples that did not pass (envs/feedback.py): fn(completions, **columns) ->
    # one short text or None per completion. Stored on Trajectory.feedback; algorithm.hint_distill's teacher reads it.
    feedback: Callable[..., Any] | None = None
    # Work done once before anything scores: prepare(rows, log) with every train and held-out row. The repair tasks
    # grade each row's starting code here (tasks/baselines.py), before any episode competes for the CPU. Called
    # through prepare_task by loop/components.build (a run, before its env check, warm start and step 0; `posttrain
    # eval`; the preflight). Must be idempotent: a second call finds the work done.
    prepare: Callable[[list[dict[str, Any]], Callable[[str], None]], None] | None = None

    def __post_init__(self) -> None:
        if not self.train_rows:
            raise ValueError(f"task {self.name!r} has no training prompts")
        for split, rows in (("train", self.train_rows), ("eval", self.eval_rows)):
            for i, row in enumerate(rows):
                if not isinstance(row, dict) or "prompt" not in row:
                    raise ValueError(f"task {self.name!r}: {split} row {i} has no 'prompt' key: {str(row)[:200]}")
                p = row["prompt"]
                if not isinstance(p, str) and not (isinstance(p, list) and all(isinstance(m, dict) for m in p)):
                    raise ValueError(
                        f"task {self.name!r}: {split} row {i} prompt must be a string or a list of "
                        f"chat messages, got {type(p).__name__}"
                    )

    @property
    def conversational(self) -> bool:
        return isinstance(self.train_rows[0]["prompt"], list)


def prepare_task(task: Task, log: Callable[[str], None] = print) -> None:
    """Run the task's one-off preparation (Task.prepare) over all its rows, if it has one."""
    if task.prepare is not None:
        task.prepare(task.train_rows + task.eval_rows, log)
