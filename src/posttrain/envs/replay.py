"""Replay a stored trajectory: does the env still show the same observation and give the same reward?

Tasks are built deterministically from their options (and seed), so a trajectory saved with
`Trajectory.to_dict()` names everything needed to redo its episode: the row's prompt locates the row in the
rebuilt task, and the stored completion text is scored again by the task's rubric (for code tasks that
means regrading in the sandbox, not reading the stored score). A mismatch means the env, its data or its
grader changed, or the grader is nondeterministic (a flaky test, a timeout near its limit).

Single-turn only for now: the one observation is the prompt, checked as text and, given a tokenizer, as the
exact prompt token ids.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from posttrain.envs.smoke_checks import score_completion
from posttrain.envs.task import Task
from posttrain.types import Trajectory


@dataclass
class ReplayResult:
    observations_equal: bool
    reward_equal: bool
    reward: float
    stored_reward: float = 0.0
    components: dict[str, float] = field(default_factory=dict)
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.observations_equal and self.reward_equal


def _find_row(task: Task, stored: dict[str, Any]) -> dict[str, Any] | None:
    """The rebuilt task's row with the stored prompt, in train or eval. Compared as JSON so a JSONL round trip
    does not matter."""
    key = json.dumps(stored.get("prompt"), sort_keys=True)
    for row in (*task.train_rows, *task.eval_rows):
        if json.dumps(row["prompt"], sort_keys=True) == key:
            return row
    return None


def _same_columns(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)


def replay(
    env_or_task: Any, trajectory: dict[str, Any] | Trajectory, tokenizer: Any = None, atol: float = 1e-6
) -> ReplayResult:
    """Re-run the observation and the scoring of a stored single-turn trajectory and compare.
    `env_or_task`: a Task or an env with `.task` (and `.tokenizer`, used when `tokenizer` is not given)."""
    task: Task = env_or_task if isinstance(env_or_task, Task) else env_or_task.task
    tokenizer = tokenizer if tokenizer is not None else getattr(env_or_task, "tokenizer", None)
    traj = trajectory if isinstance(trajectory, Trajectory) else Trajectory.from_dict(trajectory)
    if len(traj.turns) != 1:
        raise ValueError(f"replay handles single-turn trajectories; this one has {len(traj.turns)} turns")
    notes: list[str] = []
    row = _find_row(task, traj.row)
    obs_equal = row is not None
    if row is None:
        notes.append("no row of the task has the stored prompt")
        row = traj.row
    elif not _same_columns(
        {k: v for k, v in row.items() if k != "prompt"}, {k: v for k, v in traj.row.items() if k != "prompt"}
    ):
        obs_equal = False
        notes.append("the row's hidden columns (tests, expected values) changed")
    from posttrain.envs.isolate import prompt_text

    if traj.prompt_text and prompt_text(row["prompt"]) != traj.prompt_text:
        obs_equal = False
        notes.append("prompt text differs")
    if tokenizer is not None:
        from posttrain.models.chat import render_prompt

        if render_prompt(tokenizer, row["prompt"]) != list(traj.turns[0].prompt_ids):
            obs_equal = False
            notes.append("prompt token ids differ")
    s = score_completion(task, row, traj.completion_text, traj.completion_ids)
    reward_equal = abs(s.reward - traj.reward) <= atol and s.passed == traj.passed and s.failed == traj.failed
    if not reward_equal:
        notes.append(f"reward {s.reward:.4f} (passed={s.passed}) vs stored {traj.reward:.4f} (passed={traj.passed})")
    return ReplayResult(obs_equal, reward_equal, s.reward, traj.reward, dict(s.components), "; ".join(notes))
