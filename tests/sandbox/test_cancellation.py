"""Cancelled work ends: a caller that stops waiting kills its sandbox, and the pool keeps the slot until then.

Before: `asyncio.wait_for(pool.run_command(...))` timing out released the pool's slot while the worker thread
kept its sandbox running, so every timed-out call added one more live sandbox (six at once at concurrency 2).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time

from posttrain.sandbox import SandboxPool


def _live_sandboxes(staging: str) -> int:
    """Runs alive now: each has a staging dir from its start until its cleanup ended."""
    return sum(n.startswith("posttrain-sb-") for n in os.listdir(staging))


class _Sampler:
    """Counts live sandboxes every few milliseconds on a thread, keeping the maximum."""

    def __init__(self, staging: str):
        self.staging, self.peak, self._stop = staging, 0, threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _live_sandboxes(self.staging))
            time.sleep(0.005)

    def __enter__(self) -> "_Sampler":
        self._t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._t.join()


def test_cancelled_callers_never_exceed_the_pool_size(cfg, tmp_path):
    staging = str(tmp_path)
    c = cfg.model_copy(update={"staging_dir": staging, "timeout_s": 30.0, "concurrency": 2})
    pool = SandboxPool(c)

    async def caller(i: int) -> str:
        try:
            await asyncio.wait_for(pool.run_command(["sleep", "30"]), timeout=0.3 + 0.1 * i)
            return "finished"
        except asyncio.TimeoutError:
            return "timed out"

    async def main() -> list[str]:
        return list(await asyncio.gather(*(caller(i) for i in range(6))))

    t0 = time.monotonic()
    with _Sampler(staging) as s:
        outcomes = asyncio.run(main())
    took = time.monotonic() - t0
    assert outcomes == ["timed out"] * 6
    assert s.peak <= 2, f"{s.peak} sandboxes alive at once with concurrency 2"
    assert _live_sandboxes(staging) == 0  # every cancelled run was cleaned up before its caller returned
    assert took < 30, "the cancelled sleeps ran to their own timeout instead of being killed"


def test_a_cancelled_grade_kills_its_processes(cfg, tmp_path, host_guard):
    """The sandbox's processes are gone when the cancelled call returns (the host guard checks the run's uid
    after the test too)."""
    c = cfg.model_copy(update={"staging_dir": str(tmp_path), "timeout_s": 30.0})
    pool = SandboxPool(c)
    code = "import time\ndef f():\n    time.sleep(30)\n    return 1\n"

    from posttrain.sandbox.limits import processes_of_uid

    async def main() -> tuple[int, list[int]]:
        try:
            await asyncio.wait_for(pool.grade_function(code, "f", [{"args": [], "expected": 1}]), timeout=1.0)
        except asyncio.TimeoutError:
            pass
        # checked inside the loop: asyncio.run's exit would wait for a worker thread still running the sandbox
        return _live_sandboxes(str(tmp_path)), [p for u in host_guard["uids"] for p in processes_of_uid(u)]

    live, pids = asyncio.run(main())
    assert live == 0 and pids == [], (live, pids)
