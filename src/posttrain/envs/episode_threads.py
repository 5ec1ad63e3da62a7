"""Threads that each run one episode at a time in an event loop of their own (`EpisodeThreads`), so env code that
blocks its thread (a `time.sleep`, a synchronous HTTP client, CPU-bound work inside an `async` function) stalls
its own episode only: the caller's loop (the collector, the token-capturing endpoint every episode calls, the
other episodes) keeps running, and the episode's timeout fires on time.

Threads, not processes: an episode's objects (an env built by the user's function, its tasks, plugin modules
registered in this process) neither pickle nor re-import in a child, and a forked child of a process holding
threads and a GPU is not safe. The price is that a thread blocked in a sleep or in C cannot be killed:

  * a timed-out episode is cancelled; its loop runs the cancellation as soon as the blocking call returns, and
    its thread counts as stuck until then;
  * at most `max_threads` episodes run at once; the others wait for a thread, not counting against their own
    timeout (each running one ends, or turns stuck, within its timeout);
  * once `max_stuck` threads are stuck, a new episode waits up to STUCK_GRACE_S for one to come back (a
    cancelled episode tearing down is stuck for that moment only), then is refused (`EpisodeThreadsStuck`: its
    sample fails with that reason) rather than start yet another thread the same code may block. A stuck thread
    that comes back is reused (or stops, if its place was taken), and new episodes start again. So no more than
    max_threads + max_stuck threads ever exist, however long a blocking call lasts;
  * threads are daemons (one stuck for good does not hold up the interpreter's exit); `close()` stops the idle
    ones and waits for them (bounded), and a busy or stuck one stops as soon as its episode ends.

Each thread enters `setup()` (an async context manager) once on its own loop and hands what it yields to every
episode it runs (for verifiers: its own copy of the env, serving).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from posttrain.errors import PosttrainError

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")
JOIN_S = 10.0  # close(): how long to wait for the idle threads to leave their setup
STUCK_GRACE_S = 2.0  # at the stuck cap: how long a new episode waits for a stuck thread to come back


class EpisodeThreadsStuck(PosttrainError):
    fix = (
        "the env blocks its thread (time.sleep, a synchronous HTTP client, CPU-bound code in an async function): "
        "await asyncio.to_thread(...) or an async client instead, or raise timeout_s"
    )


@dataclass(eq=False)
class _Job:
    fn: Callable[[Any], Awaitable[Any]]
    caller: asyncio.AbstractEventLoop
    result: asyncio.Future  # in the caller's loop
    task: asyncio.Task | None = None  # in the thread's loop, set there before any cancel can arrive
    done: bool = False  # the thread finished it (under the pool's lock)


@dataclass(eq=False)
class _Thread:
    """One daemon thread running its own loop: `setup` entered once, then jobs (one at a time), until stopped."""

    setup: Callable[[], contextlib.AbstractAsyncContextManager[Any]]
    name: str
    generation: int
    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.new_event_loop)
    stuck: bool = False
    value: Any = None

    def __post_init__(self) -> None:
        # Made before the loop runs, so a job submitted at once finds them; both are only used on `loop`.
        self.ready: asyncio.Future = self.loop.create_future()
        self.stop_event = asyncio.Event()
        self.thread = threading.Thread(target=self._main, name=self.name, daemon=True)

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)  # for code that asks for "the" loop of its thread
        with asyncio.Runner(loop_factory=lambda: self.loop) as runner:
            runner.run(self._serve())

    async def _serve(self) -> None:
        """Setup, then wait to be stopped: also after a failed setup, so a thread's loop never closes while a job
        may still be handed to it (the pool stops a thread only when no one holds it)."""
        try:
            async with self.setup() as value:
                self.value = value
                self.ready.set_result(None)
                await self.stop_event.wait()
                return
        except Exception as e:  # noqa: BLE001 - handed to the job waiting for it; the pool then drops this thread
            if not self.ready.done():
                self.ready.set_exception(e)
            else:
                log.warning("episode thread %s: setup ended with %s: %s", self.name, type(e).__name__, e)
        await self.stop_event.wait()

    async def run(self, job: _Job) -> Any:
        await asyncio.shield(self.ready)
        return await job.fn(self.value)

    def call(self, fn: Callable[..., Any], *args: Any) -> None:
        """`fn(*args)` on this thread's loop, from any thread; nothing once the loop is closed."""
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(fn, *args)


class EpisodeThreads(Generic[T]):
    """See the module docstring. `run(fn, timeout_s)` awaits `fn(value)` on a thread of its own, `value` being what
    the thread's `setup()` yields; past `timeout_s` it raises TimeoutError and leaves the thread to come back."""

    def __init__(
        self,
        setup: Callable[[], contextlib.AbstractAsyncContextManager[T]],
        max_threads: int = 64,
        max_stuck: int = 8,
        name: str = "posttrain-episode",
    ):
        if max_threads < 1 or max_stuck < 1:
            raise ValueError("EpisodeThreads needs max_threads >= 1 and max_stuck >= 1")
        self.setup, self.max_threads, self.max_stuck, self.name = setup, max_threads, max_stuck, name
        self._lock = threading.Lock()  # all below: touched from the callers' loops and from the threads
        self._idle: list[_Thread] = []
        self._busy = 0
        self._stuck = 0
        self._all: set[_Thread] = set()
        self._waiters: deque[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = deque()
        self._generation = 0  # bumped by close(): a thread of an older one stops instead of going idle
        self._started = 0

    @property
    def stuck(self) -> int:
        """Threads still running an episode past its timeout."""
        return self._stuck

    @property
    def alive(self) -> int:
        """Threads that have not exited (idle, busy or stuck)."""
        with self._lock:
            return sum(1 for t in self._all if t.thread.is_alive())

    async def run(self, fn: Callable[[T], Awaitable[R]], timeout_s: float) -> R:
        thread = await self._acquire()
        loop = asyncio.get_running_loop()
        job = _Job(fn, loop, loop.create_future())
        thread.call(self._start, thread, job)
        try:
            return await asyncio.wait_for(asyncio.shield(job.result), timeout_s)
        except BaseException:  # the timeout or the caller's cancellation (the job's own error: done already)
            self._abandon(thread, job)
            raise

    async def close(self) -> None:
        """Stop every thread: the idle ones now (waited for, at most JOIN_S), the others once their episode ends.
        The pool stays usable: a later `run` starts fresh threads."""
        with self._lock:
            self._generation += 1
            idle, self._idle = self._idle, []
        for t in idle:
            t.call(t.stop_event.set)
        await asyncio.to_thread(_join, [t.thread for t in idle], JOIN_S)

    def stop_idle(self) -> None:
        """close() without the wait, for a finalizer (no loop needed)."""
        with self._lock:
            self._generation += 1
            idle, self._idle = self._idle, []
        for t in idle:
            t.call(t.stop_event.set)

    # ---- the caller's side -------------------------------------------------------------------------------------
    async def _acquire(self) -> _Thread:
        """A thread for one job (counted busy): an idle one, a new one, or the next one freed. At the stuck cap it
        waits STUCK_GRACE_S for a stuck thread to come back (a cancelled episode tearing down is stuck for that
        moment only), then refuses."""
        loop = asyncio.get_running_loop()
        refuse_at: float | None = None
        while True:
            with self._lock:
                at_cap = self._stuck >= self.max_stuck
                if not at_cap and self._busy < self.max_threads:
                    self._busy += 1
                    return self._idle.pop() if self._idle else self._spawn()
                if at_cap and refuse_at is not None and loop.time() >= refuse_at:
                    waiter = None
                else:
                    waiter = loop.create_future()
                    self._waiters.append((loop, waiter))
            if waiter is None:
                self._wake_next()  # the others waiting look again (and are refused the same way)
                raise EpisodeThreadsStuck(
                    f"{self._stuck} episode threads are still blocked past their timeout (the cap, max_stuck="
                    f"{self.max_stuck}): no new episode starts until one returns"
                )
            if at_cap and refuse_at is None:
                refuse_at = loop.time() + STUCK_GRACE_S
            wait_s = max(refuse_at - loop.time(), 0.0) if at_cap and refuse_at is not None else None
            try:
                await asyncio.wait({waiter}, timeout=wait_s)
            except BaseException:  # our caller was cancelled: a wake-up we already got goes to the next one
                if not waiter.cancel():
                    self._wake_next()
                raise
            finally:
                # Not woken (the grace ran out, or cancelled): a wake-up still on its way sees the future done and
                # goes to the next waiter (_wake), so none is lost.
                waiter.cancel()
                with self._lock, contextlib.suppress(ValueError):
                    self._waiters.remove((loop, waiter))

    def _spawn(self) -> _Thread:
        """A new thread (the caller holds the lock and has counted it busy)."""
        self._started += 1
        self._all = {t for t in self._all if t.thread.is_alive()}
        t = _Thread(self.setup, f"{self.name}-{self._started}", self._generation)
        self._all.add(t)
        try:
            t.thread.start()
        except BaseException:
            self._busy -= 1
            self._all.discard(t)
            raise
        return t

    def _abandon(self, thread: _Thread, job: _Job) -> None:
        with self._lock:
            if job.done:
                return
            thread.stuck = True
            self._busy -= 1
            self._stuck += 1
        job.result.cancel()  # nobody reads it now (we are in the caller's loop)
        thread.call(_cancel, job)
        self._wake_next()  # its place under max_threads is free

    # ---- the thread's side ---------------------------------------------------------------------------------------
    def _start(self, thread: _Thread, job: _Job) -> None:
        job.task = thread.loop.create_task(thread.run(job))
        job.task.add_done_callback(lambda task: self._finished(thread, job, task))

    def _finished(self, thread: _Thread, job: _Job, task: asyncio.Task) -> None:
        with self._lock:
            job.done = True
            if thread.stuck:
                thread.stuck = False
                self._stuck -= 1
            else:
                self._busy -= 1
            failed_setup = thread.ready.done() and (thread.ready.cancelled() or thread.ready.exception() is not None)
            # A stuck thread coming back may find its place under max_threads taken meanwhile: then it stops.
            room = self._busy + len(self._idle) < self.max_threads
            keep = not failed_setup and thread.generation == self._generation and room
            if keep:
                self._idle.append(thread)
        if not keep:
            thread.stop_event.set()  # on this thread's loop (we are in its callback); no one else holds it
        with contextlib.suppress(RuntimeError):  # the caller's loop is gone: nobody waits for the result
            job.caller.call_soon_threadsafe(_settle, job.result, task)
        self._wake_next()

    def _wake_next(self) -> None:
        """Wake the first caller waiting for a thread (it looks again); one whose loop is gone is skipped."""
        while True:
            with self._lock:
                if not self._waiters:
                    return
                loop, fut = self._waiters.popleft()
            try:
                loop.call_soon_threadsafe(self._wake, fut)
                return
            except RuntimeError:
                continue

    def _wake(self, fut: asyncio.Future) -> None:
        if fut.done():  # it stopped waiting meanwhile: the turn goes to the next one
            self._wake_next()
        else:
            fut.set_result(None)


def _cancel(job: _Job) -> None:
    if job.task is not None:
        job.task.cancel()


def _settle(result: asyncio.Future, task: asyncio.Task) -> None:
    """The thread's outcome, onto the caller's future (in the caller's loop)."""
    if result.done():
        return
    if task.cancelled():
        result.cancel()
    elif (e := task.exception()) is not None:
        result.set_exception(e)
    else:
        result.set_result(task.result())


def _join(threads: list[threading.Thread], timeout_s: float) -> None:
    for t in threads:
        t.join(timeout_s)
        if t.is_alive():
            log.warning("episode thread %s did not stop within %.0fs", t.name, timeout_s)
