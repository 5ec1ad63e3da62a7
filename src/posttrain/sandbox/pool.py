"""SandboxPool: async fan-out of sandboxed runs with a concurrency limit.

Each run is a blocking call bounded by its own deadline (cfg.timeout_s plus a kill grace), so a worker thread
per run is enough; the semaphore keeps at most `cfg.concurrency` sandboxes alive at once.

Where a run happens is the executor's business: `ThreadExecutor` (default) runs it on a thread of this process;
`cluster.sandbox=ray` installs `cluster/ray_grading.py`'s executor for the run (`use_executor`), and every pool
the task built then sends its runs to Ray tasks on the cluster's nodes. A pool resolves its executor at each
call, so the tasks that built pools before the run started need no change.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any, Protocol, TypeVar

from posttrain.sandbox.config import GradeResult, RunResult, SandboxConfig
from posttrain.sandbox.grading import grade_function, grade_pytest
from posttrain.sandbox.run import cancel_on, run_command
from posttrain.sandbox.tools import SandboxUnavailable

T = TypeVar("T")


class Executor(Protocol):
    """Runs one blocking sandbox call somewhere and returns its result (or raises what the call raised).

    `cancel` is set when the caller stops waiting: the executor must then end the run (kill its sandbox) and
    return or raise soon after; the pool keeps the run's slot until `call` has returned."""

    async def call(self, fn: Callable[..., T], *args: Any, cancel: threading.Event | None = None) -> T: ...


def _in_thread(cancel: threading.Event | None, fn: Callable[..., T], *args: Any) -> T:
    if cancel is None:
        return fn(*args)
    with cancel_on(cancel):
        return fn(*args)


class ThreadExecutor:
    """On a worker thread of this process (the default)."""

    async def call(self, fn: Callable[..., T], *args: Any, cancel: threading.Event | None = None) -> T:
        # The thread's runs watch `cancel` (sandbox/run.py cancel_on) and kill their sandbox when it is set.
        return await asyncio.to_thread(functools.partial(_in_thread, cancel, fn, *args))


_THREADS = ThreadExecutor()
# Process-wide, not a contextvar: graders call their pools from the rubric's worker threads and from fresh event
# loops (tasks/code_tests.run_sync), which a context variable set by the run would not reach.
_current: Executor = _THREADS


def current_executor() -> Executor:
    return _current


@contextlib.contextmanager
def use_executor(executor: Executor) -> Iterator[Executor]:
    """Send every pool's runs to `executor` inside the block (a run's lifetime); the previous one after."""
    global _current
    previous, _current = _current, executor
    try:
        yield executor
    finally:
        _current = previous


async def _until_done(work: asyncio.Future) -> None:
    """Wait for `work` to finish whatever happens to the waiter (further cancellations included); its result
    or exception is dropped (the waiter was cancelled)."""
    while not work.done():
        try:
            await asyncio.shield(work)
        except asyncio.CancelledError:
            continue
        except Exception:  # noqa: BLE001 - the run's own failure; nobody waits for it any more
            return
    if not work.cancelled():
        work.exception()  # retrieved, so asyncio does not log it as never retrieved


class SandboxPool:
    """Run sandboxed commands and graders from asyncio code, at most `cfg.concurrency` at a time."""

    def __init__(
        self, cfg: SandboxConfig | None = None, concurrency: int | None = None, executor: Executor | None = None
    ):
        """`executor`: where runs happen; None (default) follows `current_executor()` at each call."""
        self.cfg = cfg or SandboxConfig()
        self.concurrency = concurrency or self.cfg.concurrency
        self.executor = executor
        self._sem: asyncio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _semaphore(self) -> asyncio.Semaphore:
        # Created lazily and per loop: a pool built outside a loop (or reused by asyncio.run twice) still works.
        loop = asyncio.get_running_loop()
        if self._sem is None or self._loop is not loop:
            self._sem, self._loop = asyncio.Semaphore(self.concurrency), loop
        return self._sem

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        async with self._semaphore():
            cancel = threading.Event()
            work = asyncio.ensure_future((self.executor or current_executor()).call(fn, *args, cancel=cancel))
            try:
                return await asyncio.shield(work)
            except asyncio.CancelledError:
                # The caller gave up (a tool timeout's wait_for, a cancelled step): end the sandbox, and keep its
                # slot until it is gone, so cancelled callers can never put more than `concurrency` sandboxes
                # on the machine at once.
                cancel.set()
                await _until_done(work)
                raise

    async def run_command(
        self, argv: list[str], files: dict[str, str | bytes] | None = None, cfg: SandboxConfig | None = None
    ) -> RunResult:
        """Async run_command under the pool's limit."""
        return await self._call(run_command, argv, files, cfg or self.cfg)

    async def _grade(self, fn: Callable[..., GradeResult], *args: Any) -> GradeResult:
        """A grader call that fails only its own sample: anything it raises (a grader bug, an odd input) becomes
        a score of 0 with the error. SandboxUnavailable still raises: no sample can run, so nothing is graded."""
        try:
            return await self._call(fn, *args)
        except SandboxUnavailable:
            raise
        except Exception as e:  # noqa: BLE001 - one bad sample must not abort the batch
            return GradeResult(
                score=0.0,
                passed=0,
                total=0,
                per_case=[],
                isolation="none",
                error=f"grading failed: {type(e).__name__}: {str(e)[:300]}",
            )

    async def grade_function(
        self, code: str, entry_point: str, cases: list[dict], cfg: SandboxConfig | None = None
    ) -> GradeResult:
        """Async grade_function under the pool's limit; never raises for a sample (see _grade)."""
        return await self._grade(grade_function, code, entry_point, cases, cfg or self.cfg)

    async def grade_pytest(
        self,
        files: dict[str, str],
        test_files: dict[str, str],
        cfg: SandboxConfig | None = None,
        mode: str | None = None,
    ) -> GradeResult:
        """Async grade_pytest under the pool's limit; never raises for a sample (see _grade)."""
        return await self._grade(grade_pytest, files, test_files, cfg or self.cfg, mode)

    async def grade_many(self, jobs: list[tuple[str, str, list[dict]]]) -> list[GradeResult]:
        """grade_function over (code, entry_point, cases) jobs, fanned out; results in input order."""
        return await asyncio.gather(*(self.grade_function(c, e, cs) for c, e, cs in jobs))
