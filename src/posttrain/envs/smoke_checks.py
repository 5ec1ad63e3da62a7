"""Smoke checks (`posttrain env check`): prove an env can score before spending GPU hours training on it.

A task declares smoke checks as `task.smoke_checks` (a list of SmokeCheck): known-good completions that must
pass (a code task's reference solution), known-bad ones that must not (a wrong answer, a reward hack), and
shell commands with an expected output (run in the sandbox). A task with none gets one generic check: the
rubric scores an empty completion without raising. A broken env (a grader that passes everything, a
reference that fails, a sandbox that cannot start) shows up here as a red row, not as a flat reward curve.

    check_task(task) / check_tasks(tasks) -> list[CheckResult]    each check retried up to 5 times
    results_table(results) -> rich Table
    ensure_envs_ok(tasks, on_fail="refuse" | "drop")              what training calls before the first step
"""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from posttrain.envs.task import Task
from posttrain.errors import PosttrainError

MAX_ATTEMPTS = 5


@dataclass
class SmokeCheck:
    """One check. Either `completion` scored against `row` (expect "pass", "fail" or "no_error"), or `replies`:
    a scripted episode played through the task's own env and scored the same way (for multi-turn tasks whose
    reward depends on what the tools did), or `command` run in the sandbox with `expect_output` a substring its
    stdout must contain."""

    name: str
    row: dict[str, Any] | None = None
    completion: Any = None
    replies: list[str] | None = None
    expect: Literal["pass", "fail", "no_error"] = "pass"
    command: str | list[str] | None = None
    expect_output: str | None = None
    files: dict[str, str] = field(default_factory=dict)  # written next to the command
    max_attempts: int = MAX_ATTEMPTS  # a check is retried until it is ok, this many runs at most (flakes)


@dataclass
class CheckResult:
    task: str
    check: str
    expected: str
    got: str
    attempts: int
    ok: bool
    seconds: float = 0.0


class EnvCheckError(PosttrainError, RuntimeError):
    """Training refused to start: an env failed its smoke checks."""

    fix = "see every check and what it got: posttrain env check --task TASK"

    def __init__(self, message: str, results: list[CheckResult]):
        super().__init__(message)
        self.results = results


def smoke_checks(task: Task) -> list[SmokeCheck]:
    checks = list(task.smoke_checks)
    if not checks:
        checks = [SmokeCheck("scores an empty completion", row=task.train_rows[0], completion="", expect="no_error")]
    return checks


def score_completion(task: Task, row: dict[str, Any], text: str, completion_ids: list[int] | None = None) -> Any:
    """Score one completion text against one row the way SingleTurnEnv does. Returns the rubric Score."""
    completion = [{"role": "assistant", "content": text}] if task.conversational else text
    cols = {k: v for k, v in row.items() if k != "prompt"}
    if task.tools:  # ToolEnv's extra columns, for an answer given without any tool call
        cols = {**cols, "tool_calls": [], "num_turns": 1}
    (s,) = task.rubric.score([completion], [cols], prompts=[row["prompt"]], completion_ids=[completion_ids or []])
    return s


def _run_once(task: Task, check: SmokeCheck) -> tuple[str, str, bool]:
    """(expected, got, ok) for one attempt. Any exception is a failed attempt, never a crash of the check."""
    try:
        if check.command is not None:
            return _run_command_check(check)
        row = check.row or task.train_rows[0]
        if check.replies is not None:
            from posttrain.envs.scripted_play import play_episode

            s = play_episode(task, row, check.replies)
        else:
            s = score_completion(task, row, check.completion or "")
        got = f"reward={s.reward:.2f} passed={s.passed}" + (f" error={s.error[:80]}" if s.error else "")
        if check.expect == "no_error":
            return "scores without error", got, not s.failed
        if check.expect == "pass":
            return "passes", got, s.passed and not s.failed
        return "does not pass", got, not s.passed and not s.failed
    except Exception as e:  # noqa: BLE001 - a broken env can raise anything; that is what we report
        return check.expect, f"raised {type(e).__name__}: {str(e)[:120]}", False


def _run_command_check(check: SmokeCheck) -> tuple[str, str, bool]:
    from posttrain.sandbox import SandboxConfig, run_command

    argv = shlex.split(check.command) if isinstance(check.command, str) else list(check.command or [])
    files: dict[str, str | bytes] = dict(check.files)
    r = run_command(argv, files or None, SandboxConfig())
    want = check.expect_output or ""
    out = (r.stdout or "").strip()
    ok = r.error is None and not r.timed_out and r.exit_code == 0 and want in out
    got = f"exit={r.exit_code} out={out[:60]!r}" + (f" error={r.error[:60]}" if r.error else "")
    return f"exit=0 out~{want!r}", got, ok


def run_check(task: Task, check: SmokeCheck, max_attempts: int = MAX_ATTEMPTS) -> CheckResult:
    t0 = time.perf_counter()
    n = max(1, min(check.max_attempts, max_attempts))
    for attempt in range(1, n + 1):  # noqa: B007 - the count of attempts is reported after the loop
        expected, got, ok = _run_once(task, check)
        if ok:
            break
    return CheckResult(task.name, check.name, expected, got, attempt, ok, time.perf_counter() - t0)


def check_task(task: Task, max_attempts: int = MAX_ATTEMPTS) -> list[CheckResult]:
    return [run_check(task, c, max_attempts) for c in smoke_checks(task)]


def check_tasks(tasks: list[Task], max_attempts: int = MAX_ATTEMPTS) -> list[CheckResult]:
    return [r for t in tasks for r in check_task(t, max_attempts)]


def results_table(results: list[CheckResult], title: str = "env check") -> Any:
    from rich.table import Table

    table = Table(title=title)
    for col in ("task", "check", "expected", "got", "attempts", "ok"):
        table.add_column(col, overflow="fold")
    for r in results:
        table.add_row(
            r.task,
            r.check,
            r.expected,
            r.got,
            str(r.attempts),
            "[green]ok[/green]" if r.ok else "[bold red]FAIL[/bold red]",
        )
    return table


def ensure_envs_ok(
    tasks: list[Task], on_fail: Literal["refuse", "drop"] = "refuse", log: Any = print, max_attempts: int = MAX_ATTEMPTS
) -> list[Task]:
    """Run every task's smoke checks. All ok: the tasks back. Otherwise "refuse" raises EnvCheckError (with
    the results), "drop" logs and returns only the tasks whose checks all passed (EnvCheckError if none)."""
    if on_fail not in ("refuse", "drop"):
        raise ValueError(f"on_fail must be 'refuse' or 'drop', got {on_fail!r}")
    checked = [(t, check_task(t, max_attempts)) for t in tasks]
    bad = [t for t, results in checked if not all(r.ok for r in results)]
    if not bad:
        return list(tasks)
    failed = [r for _, results in checked for r in results if not r.ok]
    msg = "; ".join(f"{r.task}: {r.check}: expected {r.expected}, got {r.got}" for r in failed)
    every = [r for _, results in checked for r in results]
    if on_fail == "refuse":
        raise EnvCheckError(f"env check failed: {msg}", every)
    kept = [t for t, results in checked if all(r.ok for r in results)]
    log(f"env check: dropping {', '.join(t.name for t in bad)} ({msg})")
    if not kept:
        raise EnvCheckError(f"env check failed for every task: {msg}", every)
    return kept
