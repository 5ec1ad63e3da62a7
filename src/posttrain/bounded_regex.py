"""Model-written regexes, bounded: checked here, compiled and matched in a worker process (the rest of the
bounded host-side work on model text is in bounded.py; errors are its `BoundedError` family).

    check_pattern(pattern)              length, group nesting and the size of its counted repeats written out
                                        (the `regex` module expands `a{1000000}` to ~270 MB)
    search_lines(pattern, lines, t)     compile AND match that regex in a worker subprocess (RLIMIT_AS, RLIMIT_CPU,
                                        killed past its wall-clock budget, restarted on the next call)

The workers are worker_pool.WorkerPool's, which any worker script that speaks the same JSON lines runs on.

Nothing here keeps a cache that model text can grow. Imports only the stdlib (the worker imports `regex`).
"""

from __future__ import annotations

import atexit
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posttrain.bounded import BoundedError, BoundedTimeout, check_size
from posttrain.worker_pool import WORKER_CPU_S, WORKER_GRACE_S, WORKER_MEMORY_BYTES, WorkerPool, bad_reply

MAX_PATTERN_CHARS = 1000
MAX_PATTERN_DEPTH = 20  # nested groups
MAX_PATTERN_EXPANSION = 50_000  # items once every counted repeat is written out (`(a{100}){100}` is 10000)
REGEX_MEMORY_BYTES = WORKER_MEMORY_BYTES
REGEX_CPU_S = WORKER_CPU_S
REGEX_GRACE_S = WORKER_GRACE_S


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


@dataclass(frozen=True)
class RegexHits:
    lines: list[int]  # indices of the first `max_hits` matching lines
    total: int  # every matching line


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
        raise bad_reply("regex worker")
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
