"""Model-written regexes, bounded: checked here, compiled and matched in a worker process (the rest of the
bounded host-side work on model text is in bounded.py; errors are its `BoundedError` family).

    check_pattern(pattern)              length, group nesting and the size of its counted repeats written out
                                        (the `regex` module expands `a{1000000}` to ~270 MB)
    search_lines(pattern, lines, t)     compile AND match that regex in a worker subprocess (RLIMIT_AS, RLIMIT_CPU,
                                        killed past its wall-clock budget, restarted on the next call)
    WorkerPool(script, what)            the pool of such workers for any worker script that speaks the same JSON
                                        lines (the `math` reward's checker, rewards/_math_worker.py)

Nothing here keeps a cache that model text can grow. Imports only the stdlib (the worker imports `regex`).
"""

from __future__ import annotations

import atexit
import json
import os
import re
import select
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posttrain.bounded import BoundedError, BoundedTimeout, WorkerDied, check_size, loads_json

MAX_PATTERN_CHARS = 1000
MAX_PATTERN_DEPTH = 20  # nested groups
MAX_PATTERN_EXPANSION = 50_000  # items once every counted repeat is written out (`(a{100}){100}` is 10000)
REGEX_MEMORY_BYTES = 384 << 20  # the worker's address space (it starts at ~20 MiB with `regex` imported)
REGEX_CPU_S = 120  # the worker's CPU seconds over its life; it is replaced when it runs out
REGEX_GRACE_S = 2.0  # on top of a search's budget before the worker is killed: pipe transfer, a loaded machine


# ----------------------------------------------------------------------------------------------- regex: the check

_COUNTED = re.compile(r"\{(\d{0,9})(?:(,)(\d{0,9}))?\}")


def _class_end(p: str, i: int) -> int:
    """Index after the character class starting at p[i] == '['. A ']' first in the class is literal; a nested
    '[' (the regex module's V1 set operations) nests."""
    j, depth = i + 1, 1
    if j < len(p) and p[j] == "^":
        j += 1
    if j < len(p) and p[j] == "]":
        j += 1
    while j < len(p) and depth:
        c = p[j]
        if c == "\\":
            j += 1
        elif c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
        j += 1
    return j


def _repeat(p: str, i: int) -> tuple[int, int]:
    """(factor, length) of a counted repeat `{m}`, `{m,}`, `{,n}`, `{m,n}` at p[i]; (1, 0) if there is none.
    The factor is the larger bound: what the compiled pattern may hold written out."""
    m = _COUNTED.match(p, i)
    if m is None or not (m.group(1) or m.group(3)):
        return 1, 0
    lo, hi = int(m.group(1) or 0), int(m.group(3) or 0)
    return max(lo, hi, 1), m.end() - i


def check_pattern(
    pattern: str,
    max_chars: int = MAX_PATTERN_CHARS,
    max_depth: int = MAX_PATTERN_DEPTH,
    max_expansion: int = MAX_PATTERN_EXPANSION,
) -> None:
    """Refuse, with a clear reason (BoundedError), a regex that is too long, nests groups too deeply, or whose
    counted repeats written out exceed `max_expansion` items: `((a{100}){100}){100}` is a million, which the
    `regex` module compiles into ~300 MB. Linear in the pattern; conservative (alternatives add, not max). What
    passes can still be slow to match: that is for the worker's time budget."""
    check_size(pattern, max_chars, "pattern")
    sizes, i = [0], 0  # per open group: its items so far, counted repeats written out
    while i < len(pattern):
        c = pattern[i]
        if c == "(":
            if len(sizes) > max_depth:
                raise BoundedError(f"pattern nests groups deeper than {max_depth}")
            sizes.append(0)
            i += 1
            continue
        if c == ")" and len(sizes) > 1:
            item, i = sizes.pop(), i + 1
        elif c == "[":
            item, i = 1, _class_end(pattern, i)
        elif c == "\\":
            item, i = 1, i + 2
        else:
            item, i = (0 if c in "|^$*+?" else 1), i + 1
        factor, length = _repeat(pattern, i)
        i += length
        sizes[-1] += item * factor
        if sizes[-1] > max_expansion:
            raise BoundedError(
                f"pattern's counted repeats come to more than {max_expansion} items written out; use smaller counts"
            )


# ---------------------------------------------------------------------------------------------- regex: the worker

_WORKER = Path(__file__).with_name("_regex_worker.py")


class _Worker:
    """One worker subprocess and its pipes. Used by one thread at a time (the pool hands it out). `script` is the
    worker's file, run as `python -I script PARENT_PID MEMORY_BYTES CPU_S`: it says `ready`, then answers one JSON
    line per JSON request line (the regex worker here, the math checker in rewards/_math_worker.py)."""

    def __init__(
        self, memory_bytes: int, cpu_s: int, start_timeout_s: float, script: Path = _WORKER, what: str = "regex worker"
    ):
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
            self.kill()
            raise BoundedError(f"the {self.what} sent a bad reply") from None
        if not isinstance(reply, dict):
            self.kill()
            raise BoundedError(f"the {self.what} sent a bad reply")
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


@dataclass(frozen=True)
class RegexHits:
    lines: list[int]  # indices of the first `max_hits` matching lines
    total: int  # every matching line


_POOLS: weakref.WeakSet[WorkerPool] = weakref.WeakSet()  # every pool of this process (close_all_pools)


def close_all_pools() -> None:
    """End the workers of every pool of this process now (a pool starts new ones when next used): for a host that
    must show it leaves no process behind before the interpreter's own exit closes them (the test session's check)."""
    for pool in list(_POOLS):
        pool.close()


class WorkerPool:
    """Worker subprocesses that do bounded work on model text outside the trainer's memory and time: one JSON
    request, one JSON reply (`_Worker`). RegexPool below runs `_regex_worker.py`; the `math` reward runs
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
        memory_bytes: int = REGEX_MEMORY_BYTES,
        cpu_s: int = REGEX_CPU_S,
        grace_s: float = REGEX_GRACE_S,
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


class RegexPool(WorkerPool):
    """Workers that compile and match model-written regexes (`_regex_worker.py`); the host side keeps no pattern
    or compiled object."""

    def __init__(
        self,
        size: int = 2,
        memory_bytes: int = REGEX_MEMORY_BYTES,
        cpu_s: int = REGEX_CPU_S,
        grace_s: float = REGEX_GRACE_S,
        start_timeout_s: float = 30.0,
        wait_s: float = 60.0,
        recycle_after: int = 1000,
    ):
        super().__init__(
            _WORKER, "regex worker", size, memory_bytes, cpu_s, grace_s, start_timeout_s, wait_s, recycle_after
        )

    def search(
        self,
        pattern: str,
        lines: Sequence[str],
        timeout_s: float,
        ignore_case: bool = False,
        max_hits: int = 100,
        precheck: bool = True,
    ) -> RegexHits:
        """Which of `lines` `pattern` matches (regex module semantics, `search`), within `timeout_s` of matching
        time. Raises BoundedError: a refused or invalid pattern, a worker out of memory; BoundedTimeout past the
        budget. `precheck=False` skips `check_pattern` (tests of the worker's own limits)."""
        if precheck:
            check_pattern(pattern)
        request = {
            "pattern": pattern,
            "lines": list(lines),
            "timeout": float(timeout_s),
            "ignore_case": bool(ignore_case),
            "max_hits": int(max_hits),
        }
        reply = self.request(
            request,
            timeout_s,
            2048 + 12 * max_hits,
            died="the regex worker died (the pattern needed too much memory or CPU)",
            late="the regex took too long",
        )
        return _hits(reply, timeout_s, self.memory_bytes)


def _hits(reply: dict[str, Any], timeout_s: float, memory_bytes: int) -> RegexHits:
    error = reply.get("error")
    if error == "timeout":
        raise BoundedTimeout(f"the regex took longer than {timeout_s:g}s")
    if error == "memory":
        raise BoundedError(f"the regex needs more than {memory_bytes >> 20} MiB")
    if error is not None:
        raise BoundedError(f"bad regular expression: {str(reply.get('message', error))[:120]}")
    lines, total = reply.get("lines"), reply.get("total")
    if not isinstance(lines, list) or not all(type(x) is int for x in lines) or type(total) is not int:
        raise BoundedError("the regex worker sent a bad reply")
    return RegexHits(lines, total)


_POOL: RegexPool | None = None
_POOL_LOCK = threading.Lock()


def default_pool() -> RegexPool:
    """The process's shared pool (made on first use, closed at exit)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = RegexPool()
            atexit.register(_POOL.close)
        return _POOL


def search_lines(
    pattern: str,
    lines: Sequence[str],
    timeout_s: float,
    ignore_case: bool = False,
    max_hits: int = 100,
    precheck: bool = True,
) -> RegexHits:
    """`default_pool().search(...)`: see RegexPool.search."""
    return default_pool().search(pattern, lines, timeout_s, ignore_case, max_hits, precheck)
