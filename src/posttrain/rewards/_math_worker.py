"""The `math` reward's checker (rewards/named.py): math-verify's parse and verify, in a process of their own.

Run by worker_pool.WorkerPool as `python -I _math_worker.py PARENT_PID MEMORY_BYTES CPU_S`, like the regex
worker, whose limits, request loop and parent watch it reuses (`_regex_worker.py`, loaded by path: this script
never imports posttrain). It imports math-verify once, says `ready`, then answers one JSON line per request:

    {"items": [[gold, answer], ...], "timeout": s per item, "budget": s for the whole request}
    -> {"results": [1 | 0 | "timeout" | "gold" | "error", ...]}    one per item, in order

1: the answer equals the gold; 0: it does not (or says nothing parseable); "timeout": the item ran past its time
(or the request past its budget); "gold": the gold answer did not parse; "error": the check raised or its process
died (out of memory).

Why a fork per request: sympy can spend minutes on a hostile answer (`9^{9^{9^{9}}}` evaluates a tower of powers
in C, where no signal lands), so the checking runs in a child of this process that is killed at the item's
deadline. This process imported math-verify once; a fork costs a few milliseconds, so a timeout costs a new child,
not a new interpreter. After a kill the next child takes the items that are left. math-verify's own
signal-based timeout is off (it works only in a main thread, and the kill is what bounds the time here).
"""

import ctypes
import gc
import importlib.util
import json
import logging
import os
import re
import resource
import select
import signal
import sys
import time
from pathlib import Path
from typing import Any


def _base():
    """The regex worker's helpers (`_limit`, `_reply`, `_next_request`), loaded from its file."""
    path = Path(__file__).resolve().parent.parent / "_regex_worker.py"
    spec = importlib.util.spec_from_file_location("_posttrain_regex_worker", path)
    assert spec is not None and spec.loader is not None  # a .py path always gets a source loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _checker():
    """check(gold, answer) -> 1, 0 or "gold", on math-verify imported once (and warmed up: its first call
    builds the LaTeX grammar, which must not count against an answer's time)."""
    logging.disable(logging.CRITICAL)  # math-verify warns about the disabled timeout on every call
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    config = [LatexExtractionConfig(), ExprExtractionConfig()]
    words = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{2,}")  # a word that is not a LaTeX command (\\frac, \\text)
    no_timeout: Any = None  # math-verify annotates parsing_timeout as int, yet takes None for no timeout

    def parsed(text: str):
        # Bare math (\frac34, 2^{1/2}, (1, 2), 1+x^2) reads right only as LaTeX in $...$; a sentence ("It is 12 cm",
        # "The answer is 7.") only as math-verify reads free text. Each falls back to the other.
        latex = lambda: parse("$" + text + "$", config, parsing_timeout=no_timeout)
        plain = lambda: parse(text, config, parsing_timeout=no_timeout)
        first, second = (plain, latex) if words.search(text) else (latex, plain)
        return first() or second()

    def check(gold: str, answer: str):
        g = parsed(gold)
        if not g:
            return "gold"
        a = parsed(answer) if answer else []
        return int(bool(a) and verify(g, a, timeout_seconds=None))

    check("1/2", "\\frac{1}{2}")
    return check


def _child(check, items: list, start: int, out: int, cpu_s: int) -> None:
    """In the forked child: check items[start:], one JSON line per item on `out`, then exit."""
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the worker
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
        for i in range(start, len(items)):
            try:
                r = check(str(items[i][0]), str(items[i][1]))
            except Exception:  # noqa: BLE001 - whatever sympy raises on a hostile answer is a wrong answer
                r = "error"
            os.write(out, (json.dumps({"i": i, "r": r}) + "\n").encode())
    finally:
        os._exit(0)


def _read_result(fd: int, buf: bytearray, deadline: float):
    """The next {"i", "r"} line from the child by `deadline`; None at the deadline, "eof" when it died."""
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return None
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return "eof"
        buf += chunk
    line, _, rest = bytes(buf).partition(b"\n")
    buf[:] = rest
    return json.loads(line)


def _run(check, req: dict, cpu_s: int) -> dict:
    """Check every item of a request, each in at most its time, all of them within the budget."""
    items, per_item = req["items"], float(req["timeout"])
    batch_deadline = time.monotonic() + float(req["budget"])
    results: list = ["timeout"] * len(items)
    i = 0
    while i < len(items) and time.monotonic() < batch_deadline:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            _child(check, items, i, w, min(int(req["budget"]) + 2, cpu_s))
        os.close(w)
        buf = bytearray()
        while i < len(items):
            got = _read_result(r, buf, min(time.monotonic() + per_item, batch_deadline))
            if got is None or got == "eof":
                results[i] = "timeout" if got is None else "error"
                i += 1
                break  # a new child takes the items after this one
            results[got["i"]], i = got["r"], got["i"] + 1
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(r)
    return {"results": results}


def main() -> None:
    base = _base()
    parent, memory_bytes, cpu_s = (int(x) for x in sys.argv[1:4])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the trainer; it closes our stdin when it exits
    check = _checker()
    base._limit(memory_bytes, cpu_s)
    gc.freeze()  # what is imported stays shared with every child (no copy-on-write of the heap per fork)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    while True:
        line = base._next_request(parent)
        if not line:
            return
        try:
            reply = _run(check, json.loads(line), cpu_s)
        except MemoryError:
            base._reply({"error": "memory"})
            return
        base._reply(reply)


if __name__ == "__main__":
    main()
