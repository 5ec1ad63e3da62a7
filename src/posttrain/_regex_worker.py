"""The regex worker (posttrain.bounded_regex.RegexPool): compiles and matches model-written patterns in its own process.

Run as a script by path, `python -I _regex_worker.py PARENT_PID MEMORY_BYTES CPU_S`; imports only the stdlib and
`regex`, never posttrain. It limits its own address space and CPU time, says `ready`, then answers one JSON
request per line on stdin with one JSON reply per line on stdout:

    {"pattern": str, "lines": [str], "timeout": s, "ignore_case": bool, "max_hits": n}
    -> {"lines": [indices of the first max_hits matching lines], "total": n}
     | {"error": "timeout" | "memory" | "pattern", "message": str}

It exits on EOF of stdin, when its parent is gone (polled: PR_SET_PDEATHSIG would fire when the *thread* that
started it ends, and tool calls run in short-lived threads), after a MemoryError (its heap may be fragmented),
and the kernel ends it at its CPU limit. It keeps no compiled pattern between requests.
"""

import json
import os
import resource
import select
import signal
import sys
import time

PARENT_POLL_S = 1.0


def _limit(memory_bytes: int, cpu_s: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 5))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))  # it never writes a file
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _search(regex, req: dict) -> dict:
    flags = regex.IGNORECASE if req.get("ignore_case") else 0
    try:
        rx = regex.compile(req["pattern"], flags, cache_pattern=False)
    except MemoryError:
        raise
    except Exception as e:  # noqa: BLE001 - any pattern the module rejects is the model's mistake
        return {"error": "pattern", "message": str(e)[:200]}
    deadline = time.monotonic() + float(req["timeout"])
    max_hits, hits, total = int(req.get("max_hits", 100)), [], 0
    for i, line in enumerate(req["lines"]):
        left = deadline - time.monotonic()
        if left <= 0:
            return {"error": "timeout"}
        try:
            found = rx.search(line, timeout=left) is not None
        except TimeoutError:
            return {"error": "timeout"}
        if found:
            total += 1
            if len(hits) < max_hits:
                hits.append(i)
    return {"lines": hits, "total": total}


def _reply(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _next_request(parent: int) -> bytes:
    """The next request line; b"" when stdin closed or the parent is gone."""
    while True:
        if os.getppid() != parent:
            return b""
        if select.select([sys.stdin.buffer], [], [], PARENT_POLL_S)[0]:
            return sys.stdin.buffer.readline()


def main() -> None:
    parent, memory_bytes, cpu_s = (int(x) for x in sys.argv[1:4])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the trainer; it closes our stdin when it exits
    import regex

    _limit(memory_bytes, cpu_s)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    while True:
        line = _next_request(parent)
        if not line:
            return
        try:
            reply = _search(regex, json.loads(line))
        except MemoryError:
            _reply({"error": "memory"})
            return
        finally:
            regex.purge()  # cache_pattern=False already; the module's other caches go too
        _reply(reply)


if __name__ == "__main__":
    main()
