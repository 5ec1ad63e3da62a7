"""Worker subprocesses for bounded work on model text: one JSON request line, one JSON reply line, each worker
under RLIMIT_AS and RLIMIT_CPU and killed past its wall-clock budget. bounded_regex.RegexPool runs model-written
regexes on it, the `math` reward its answer checker (rewards/_math_worker.py), reasoning-gym its scorers
(tasks/_reasoning_gym_worker.py). Imports only the stdlib.

    pool = WorkerPool(script, what)     workers started on demand, at most `size` at once
    pool.request(req, budget_s, ...)    one call on one worker; BoundedTimeout past its budget (the worker is killed)
    close_all_pools()                   every pool of this process ends its workers now
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import Any

from posttrain.bounded import BoundedError, BoundedTimeout, WorkerDied, loads_json

WORKER_MEMORY_BYTES = 384 << 20  # a worker's address space (the regex worker starts at ~20 MiB with `regex` imported)
WORKER_CPU_S = 120  # a worker's CPU seconds over its life; it is replaced when it runs out
WORKER_GRACE_S = 2.0  # on top of a call's budget before the worker is killed: pipe transfer, a loaded machine


def bad_reply(what: str, reply: object = None) -> BoundedError:
    """The one error for a worker's reply that is not what its protocol says (the worker pool's check: one JSON
    object; a caller's check of the object's fields), naming the worker and, when given, what it sent (cut)."""
    return BoundedError(f"the {what} sent a bad reply" + ("" if reply is None else f": {str(reply)[:200]}"))


class _Worker:
    """One worker subprocess and its pipes. Used by one thread at a time (the pool hands it out). `script` is the
    worker's file, run as `python -I script PARENT_PID MEMORY_BYTES CPU_S`: it says `ready`, then answers one JSON
    line per JSON request line (the regex worker here, the math checker in rewards/_math_worker.py)."""

    def __init__(self, memory_bytes: int, cpu_s: int, start_timeout_s: float, script: Path, what: str):
        self.what = what
        if not sys.executable:
            raise BoundedError(f"no Python interpreter to run the {what}")
        # `-I`: no environment variables, user site or script directory reach the worker; it is a fresh
        # interpreter (exec), never a fork of the trainer with its memory and threads.
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", str(script), str(os.getpid()), str(memory_bytes), str(cpu_s)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                bufsize=0,
                close_fds=True,
            )
        except OSError as e:  # out of processes or file descriptors: the search fails, not the caller
            raise BoundedError(f"the {what} could not start ({e.strerror or e})") from None
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.win, self.rout = self.proc.stdin.fileno(), self.proc.stdout.fileno()
        os.set_blocking(self.win, False)
        os.set_blocking(self.rout, False)
        self.calls, self.killed = 0, False
        self.epoch = 0  # the pool's close count when it started (WorkerPool: one started before a close ends)
        try:
            ready = self._read_line(time.monotonic() + start_timeout_s, 64)
        except OSError:
            ready = None
        if ready != b"ready":
            self.kill()
            raise BoundedError(f"the {what} did not start")

    def alive(self) -> bool:
        return not self.killed and self.proc.poll() is None

    def kill(self) -> None:
        self.killed = True
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL not delivered within 5 s
            pass
        for f in (self.proc.stdin, self.proc.stdout):
            assert f is not None  # both are pipes (Popen in __init__)
            try:
                f.close()
            except OSError:
                pass

    def close(self) -> None:
        """End it politely: EOF on its stdin makes it exit; kill if it does not."""
        assert self.proc.stdin is not None  # a pipe (Popen in __init__)
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=1)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.kill()

    def call(
        self, request: dict[str, Any], deadline: float, max_reply: int, died: str = "", late: str = ""
    ) -> dict[str, Any]:
        """Send one request and read its reply by `deadline`; the worker is killed if it misses the deadline or
        answers nonsense (the caller drops a dead worker). `died` / `late`: the messages for those two cases."""
        self.calls += 1
        try:
            self._write_all((json.dumps(request) + "\n").encode(), deadline)
            line = self._read_line(deadline, max_reply)
        except OSError:  # a broken pipe, EOF: it is gone
            self.kill()
            raise WorkerDied(died or f"the {self.what} died") from None
        if line is None:
            self.kill()
            raise BoundedTimeout(late or f"the {self.what} took too long")
        try:
            reply = loads_json(line.decode("utf-8", "replace"), max_chars=max_reply)
        except BoundedError:
            reply = None
        if not isinstance(reply, dict):  # not JSON, or JSON but not the one object the protocol says
            self.kill()
            raise bad_reply(self.what)
        return reply

    @staticmethod
    def _ready(fd: int, event: int, deadline: float) -> bool:
        """Whether `fd` is ready for `event` before `deadline`. poll, not select: a trainer with many open files
        has descriptors past select's limit of 1024."""
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        poller = select.poll()
        poller.register(fd, event)
        return bool(poller.poll(max(1, int(left * 1000))))

    def _write_all(self, data: bytes, deadline: float) -> None:
        view = memoryview(data)
        while view:
            if not self._ready(self.win, select.POLLOUT, deadline):
                raise OSError("write timed out")
            try:
                view = view[os.write(self.win, view) :]
            except BlockingIOError:
                continue

    def _read_line(self, deadline: float, max_bytes: int) -> bytes | None:
        """One line from the worker (without the newline), or None at the deadline. EOF or a line over
        `max_bytes` raise OSError."""
        buf = bytearray()
        while True:
            nl = buf.find(b"\n")
            if nl >= 0:
                return bytes(buf[:nl])
            if len(buf) > max_bytes:
                raise OSError("reply too long")
            if not self._ready(self.rout, select.POLLIN, deadline):
                return None
            try:
                chunk = os.read(self.rout, 1 << 16)
            except BlockingIOError:
                continue
            if not chunk:
                raise OSError("worker closed its output")
            buf += chunk


_POOLS: weakref.WeakSet[WorkerPool] = weakref.WeakSet()  # every pool of this process (close_all_pools)


def close_all_pools() -> None:
    """End the workers of every pool of this process now (a pool starts new ones when next used): for a host that
    must show it leaves no process behind before the interpreter's own exit closes them (the test session's check)."""
    for pool in list(_POOLS):
        pool.close()


class WorkerPool:
    """Worker subprocesses that do bounded work on model text outside the trainer's memory and time: one JSON
    request, one JSON reply (`_Worker`). bounded_regex.RegexPool runs `_regex_worker.py`; the `math` reward runs
    rewards/_math_worker.py on the same pool.

    Thread-safe: up to `size` calls run at once, each on its own worker; more wait for one (at most `wait_s`). A
    worker that misses its deadline (the call's budget + `grace_s`), dies (RLIMIT_AS, RLIMIT_CPU) or answers
    nonsense is killed and replaced on the next call; one that served `recycle_after` calls is replaced too, so
    nothing it held accumulates. `close` ends the idle workers, and each busy one when its call hands it back."""

    def __init__(
        self,
        script: Path,
        what: str,
        size: int = 2,
        memory_bytes: int = WORKER_MEMORY_BYTES,
        cpu_s: int = WORKER_CPU_S,
        grace_s: float = WORKER_GRACE_S,
        start_timeout_s: float = 30.0,
        wait_s: float = 60.0,
        recycle_after: int = 1000,
    ):
        self.script, self.what = script, what
        self.memory_bytes, self.cpu_s, self.grace_s = memory_bytes, cpu_s, grace_s
        self.start_timeout_s, self.wait_s, self.recycle_after = start_timeout_s, wait_s, recycle_after
        self._slots = threading.BoundedSemaphore(size)
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []
        self._pid = os.getpid()
        self._epoch = 0  # how many times the pool was closed: a worker started before the last close is not reused
        self.started = 0  # workers started, for tests and metrics
        _POOLS.add(self)

    def request(
        self, request: dict[str, Any], budget_s: float, max_reply: int, died: str = "", late: str = ""
    ) -> dict[str, Any]:
        """The worker's reply to `request`, which may take `budget_s` (+ grace) on the worker. Raises
        BoundedTimeout past it (`late`), WorkerDied (`died`) when the worker died twice, BoundedError when every
        worker stayed busy for `wait_s`."""
        if not self._slots.acquire(timeout=self.wait_s):
            raise BoundedTimeout(f"every {self.what} is busy")
        try:
            try:
                return self._call(request, budget_s, max_reply, died, late)
            except WorkerDied:
                # An idle worker can die between calls (killed from outside, the OOM killer) and look alive
                # until the kernel reaps it: one more try on a fresh one. A request that kills the worker
                # itself fails twice and is reported.
                return self._call(request, budget_s, max_reply, died, late, fresh=True)
        finally:
            self._slots.release()

    def _call(
        self, request: dict[str, Any], budget_s: float, max_reply: int, died: str, late: str, fresh: bool = False
    ) -> dict[str, Any]:
        worker = self._take(fresh)
        try:
            reply = worker.call(request, time.monotonic() + budget_s + self.grace_s, max_reply, died, late)
            if reply.get("error") == "memory":
                worker.kill()  # it exits after a MemoryError; never hand it out again
            return reply
        finally:
            self._give(worker)

    def _take(self, fresh: bool = False) -> _Worker:
        self._forget_if_forked()
        with self._lock:
            while self._idle and not fresh:
                w = self._idle.pop()
                if w.alive():
                    return w
                w.kill()
        with self._lock:
            epoch = self._epoch
        w = _Worker(self.memory_bytes, self.cpu_s, self.start_timeout_s, self.script, self.what)
        w.epoch = epoch
        with self._lock:
            self.started += 1
        return w

    def _give(self, worker: _Worker) -> None:
        with self._lock:
            keep = worker.alive() and worker.calls < self.recycle_after and os.getpid() == self._pid
            if keep and worker.epoch == self._epoch:
                self._idle.append(worker)
                return
        worker.close() if worker.alive() else worker.kill()

    def _forget_if_forked(self) -> None:
        # A forked child shares the parent's pipes to its workers: using them would interleave two processes'
        # requests. The child starts its own workers (the parent's stay the parent's).
        if os.getpid() != self._pid:
            with self._lock:
                self._idle, self._pid = [], os.getpid()

    def close(self) -> None:
        """End every idle worker now and every busy one when it is handed back; a later call starts new ones."""
        with self._lock:
            idle, self._idle = self._idle, []
            self._epoch += 1
        if os.getpid() == self._pid:
            for w in idle:
                w.close()
