"""Baselines of the repair tasks: each row's starting code graded against its pristine tests, the split that
issue_tests measures against (rewards/repair_grades.py: the tests it fails are the issue, the ones it passes must
keep passing).

A row's baseline is graded once and kept for the run, so a wrong one is wrong for every later sample of that row.
It is therefore kept only when its grade came to a verdict (GradeResult.per_test not None). Before this, a
baseline whose grade timed out under CPU contention from sibling episodes came back as "every test failed" and was
cached, and untouched code then earned issue_tests 0.5 and more for the rest of the run.

How a baseline gets graded:
- Up front (`prepare`, which the tasks hand to `Task.prepare` and loop/components.build calls): every train and
  held-out row at once, at the pool's concurrency, before any episode competes for the CPU, with `TIMEOUT_FACTOR`
  times the per-sample time limits and up to `max_tries` tries per row. One progress line per `PROGRESS_EVERY`
  rows, and a summary line with the time.
- On request (`get`), for a row still unknown (prepare was not called, or its tries failed): one try per request.
- Never cached on a failed grade. After `max_tries` failed tries in all, the row is given up for the life of the
  process, with one error logged; its samples then fail with the reason (test_sets.issue_rewards), never a guess.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from posttrain.aio import run_sync
from posttrain.rewards.repair_grades import Baseline

TIMEOUT_FACTOR = 3.0  # the starting code is ours and does not hang: a baseline out of time is the machine's doing
MAX_TRIES = 3
PROGRESS_EVERY = 10

logger = logging.getLogger(__name__)

Row = dict[str, Any]
Subject = Callable[[Row], tuple[dict[str, str], dict[str, str]]]  # row -> (starting source files, pristine tests)
Say = Callable[[str], None]


def baseline_config(cfg: Any, factor: float = TIMEOUT_FACTOR) -> Any:
    """`cfg` (a SandboxConfig) with `factor` times its time limits: the run's wall clock, RLIMIT_CPU when set,
    and the per-request deadline when set (out-of-process grading otherwise uses the run's timeout for it)."""
    update: dict[str, Any] = {"timeout_s": cfg.timeout_s * factor}
    if cfg.cpu_s is not None:
        update["cpu_s"] = math.ceil(cfg.cpu_s * factor)
    if cfg.case_timeout_s is not None:
        update["case_timeout_s"] = cfg.case_timeout_s * factor
    return cfg.model_copy(update=update)


def verdict(g: Any) -> dict[str, bool] | None:
    """A grade's per-test verdicts when a baseline may be read from them: a complete report (grade_pytest gives
    per_test None otherwise) from a run that was not cut short. A run that timed out or was OOM-killed after its
    report is refused too: the machine was starved, and one more try costs seconds where a wrong baseline costs
    the row's reward for the whole run."""
    run = getattr(g, "run", None)
    if g.per_test is None or g.timed_out or (run is not None and run.oom_killed):
        return None
    return g.per_test


class BaselineStore:
    """Baselines by row key, kept only once graded to a verdict. Shared by a task's reward and episodes, and
    pickled with them to Ray env workers (cluster.envs=ray), so it holds no pool and no loop of its own."""

    def __init__(
        self,
        name: str,
        cfg: Any,
        subject: Subject,
        key: Callable[[Row], str],
        mode: str | None = None,
        max_tries: int = MAX_TRIES,
        timeout_factor: float = TIMEOUT_FACTOR,
    ) -> None:
        self.name, self.subject, self.key, self.mode, self.max_tries = name, subject, key, mode, max_tries
        self.cfg = baseline_config(cfg, timeout_factor)
        self.grades = 0  # grades run so far (tests, and the summary line)
        self._known: dict[str, dict[str, bool]] = {}
        self._failures: dict[str, int] = {}
        self._why: dict[str, str] = {}  # key -> the last failed try's reason
        self._lock = threading.Lock()  # rewards grade from the rubric's threads, episodes from the env's loop

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        del state["_lock"]  # not picklable; a copy on another process gets its own
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def given_up(self, key: str) -> bool:
        return self._failures.get(key, 0) >= self.max_tries

    def cached(self, row: Row) -> Baseline | None:
        """The row's baseline when settled (graded, or given up: unknown with the reason); None while it is
        still to be graded."""
        key = self.key(row)
        if key in self._known:
            return Baseline(self._known[key])
        if self.given_up(key):
            return Baseline(None, f"{self._why.get(key)} ({self.max_tries} tries; given up for this row)")
        return None

    async def get(self, row: Row, pool: Any) -> Baseline:
        """The row's baseline; one try through `pool` (the task's, so it shares the episodes' concurrency limit)
        when it is not settled yet. Episodes of one issue ending at once may each try; every failed try counts."""
        return self.cached(row) or await self._try(row, pool, None)

    async def _try(self, row: Row, pool: Any, say: Say | None) -> Baseline:
        files, tests = self.subject(row)
        g = await pool.grade_pytest(files, tests, self.cfg, mode=self.mode)  # raises only SandboxUnavailable
        return self._record(self.key(row), g, say)

    def _record(self, key: str, g: Any, say: Say | None) -> Baseline:
        with self._lock:
            self.grades += 1
            if verdict(g) is not None:
                self._known[key] = dict(g.per_test)
                return Baseline(self._known[key])
            why = (g.error or ("timed out" if g.timed_out else "killed at the memory limit"))[:300]
            n = self._failures[key] = self._failures.get(key, 0) + 1
            self._why[key] = why
        if n == self.max_tries:  # exactly once per row: later requests find it given up and do not try
            msg = (
                f"{self.name}: the baseline of {key} is given up after {n} failed tries ({why}); its samples "
                "fail (kept out of training) instead of being paid against a guess"
            )
            (say or logger.error)(msg)
        return Baseline(None, f"{why} (try {n} of {self.max_tries})")

    def prepare(self, rows: list[Row], say: Say = print) -> None:
        """Grade the baseline of every row not settled yet, all at once at the sandbox's concurrency, each up to
        `max_tries` times. Idempotent: a second call grades nothing."""
        from posttrain.sandbox import SandboxPool
        from posttrain.sandbox.tools import SandboxUnavailable

        todo: dict[str, Row] = {}
        for r in rows:
            if self.cached(r) is None:
                todo.setdefault(self.key(r), r)
        if not todo:
            return
        t0, done = time.perf_counter(), [0]
        # A pool of its own with the same concurrency: the task's pool would keep this call's event loop, and
        # the task is pickled to Ray env workers after this.
        pool = SandboxPool(self.cfg)

        async def settle(row: Row) -> None:
            while (await self._try(row, pool, say)).per_test is None and not self.given_up(self.key(row)):
                pass
            done[0] += 1
            if done[0] % PROGRESS_EVERY == 0 and done[0] < len(todo):
                say(f"{self.name} baselines: {done[0]}/{len(todo)} rows [{time.perf_counter() - t0:.0f}s]")

        async def all_rows() -> None:
            await asyncio.gather(*(settle(r) for r in todo.values()))

        grades = self.grades
        try:
            run_sync(all_rows)
        except SandboxUnavailable as e:  # nothing can be graded here; each sample's grade will say so too
            say(f"{self.name} baselines: not graded, no sandbox: {e}")
            return
        unknown = [k for k in todo if k not in self._known]
        say(
            f"{self.name} baselines: {len(todo) - len(unknown)} of {len(todo)} rows graded "
            f"({self.grades - grades} grades) in {time.perf_counter() - t0:.1f}s"
            + (f"; {len(unknown)} unknown, their samples fail: {', '.join(unknown[:5])}" if unknown else "")
        )
