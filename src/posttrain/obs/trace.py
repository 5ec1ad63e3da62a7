"""Trace events: where each worker spent its time, as RUN_DIR/trace.jsonl and as Chrome/Perfetto trace JSON.

    trace.start(run_dir / "trace.jsonl")           the Run turns tracing on (one run per process at a time)
    with trace.span("train", worker="trainer"):   one complete event per stage: start, duration, pid, tid, worker
    trace.stop()

`StageTimer` (obs/timers.py) opens a span for every stage it times, so the stages that already have `time/*`
metrics (sample, reward, train, sync) are traced without a second set of timers; the async collector names its
rollout workers, so their lanes overlap the trainer's in the timeline. With tracing off (the default outside a
Run) a span costs one global lookup.

A line of trace.jsonl: {"name", "worker", "ts" (seconds since the epoch, so a resumed run continues the same
time axis), "dur" (seconds), "pid", "tid", "args"}. It is written when the span ends and flushed at once, so a
crashed run keeps every span that finished.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

TRACE_FILE = "trace.jsonl"


class Tracer:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._lock = threading.Lock()  # train and sync spans end in worker threads (asyncio.to_thread)
        self._f = open(self.path, "a", buffering=1)
        self.failed = False

    def write(self, event: dict[str, Any]) -> None:
        if self.failed:
            return
        try:
            with self._lock:
                self._f.write(json.dumps(event, default=str) + "\n")
        except (OSError, ValueError):  # a full disk or a closed file must not stop training
            self.failed = True

    def close(self) -> None:
        with self._lock:
            self._f.close()


_active: Tracer | None = None


def start(path: str | Path) -> Tracer:
    global _active
    stop()
    _active = Tracer(path)
    return _active


def stop() -> None:
    global _active
    if _active is not None:
        _active.close()
        _active = None


def enabled() -> bool:
    return _active is not None


@contextmanager
def span(name: str, worker: str = "main", **args: Any) -> Iterator[None]:
    """Record `name` on `worker`'s lane from entry to exit (also when the body raises)."""
    tracer = _active
    if tracer is None:
        yield
        return
    ts, t0 = time.time(), time.perf_counter()
    try:
        yield
    finally:
        tracer.write(
            {
                "name": name,
                "worker": worker,
                "ts": ts,
                "dur": time.perf_counter() - t0,
                "pid": os.getpid(),
                "tid": threading.get_native_id(),
                "args": args,
            }
        )


def read_trace(run_dir: str | Path) -> list[dict[str, Any]]:
    """The run's trace events ([] when it has none), skipping a half-written last line."""
    path = Path(run_dir) / TRACE_FILE
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            e = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(e, dict) and {"name", "ts", "dur"} <= e.keys():
            out.append(e)
    return out


def to_chrome_trace(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Chrome trace-event JSON (chrome://tracing, ui.perfetto.dev): one complete ("X") event per span, in
    microseconds from the first span. Each worker is its own lane (tid), named by a thread_name metadata event;
    the OS thread id stays in args, since asyncio rollout workers share one thread and would overlap in it."""
    if not events:
        return {"traceEvents": [], "displayTimeUnit": "ms"}
    t0 = min(e["ts"] for e in events)
    pid = events[0].get("pid", 0)
    lanes: dict[str, int] = {}
    for w in sorted({e.get("worker", "main") for e in events}, key=lane_order):
        lanes[w] = len(lanes) + 1
    out: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": "posttrain run"}}
    ]
    out += [{"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": w}} for w, tid in lanes.items()]
    out += [
        {"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}}
        for tid in lanes.values()
    ]
    for e in sorted(events, key=lambda e: e["ts"]):
        out.append(
            {
                "name": e["name"],
                "cat": "stage",
                "ph": "X",
                "pid": pid,
                "tid": lanes[e.get("worker", "main")],
                "ts": round((e["ts"] - t0) * 1e6, 1),
                "dur": round(e["dur"] * 1e6, 1),
                "args": {**(e.get("args") or {}), "os_pid": e.get("pid"), "os_tid": e.get("tid")},
            }
        )
    return {"traceEvents": out, "displayTimeUnit": "ms"}


def lane_order(worker: str) -> tuple[int, int, str]:
    """The trainer's lane first, then rollout workers by number (rollout-2 before rollout-10)."""
    head, _, num = worker.rpartition("-")
    if num.isdigit():
        return (1, int(num), head)
    return (0, 0, worker)
