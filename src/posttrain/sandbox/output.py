"""A running sandbox's output: its pipes pumped into capped buffers until it ends or its time is up, its process
group killed, and what it left as a RunResult."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field

from posttrain.sandbox.cgroups import RunCgroup
from posttrain.sandbox.config import RunResult

KILL_GRACE_S = 2.0  # after SIGKILL, how long we wait for pipes to close before giving up on them
EXIT_DRAIN_S = 0.5  # after the launcher exits, how long a leftover writer may keep our pipes open


@dataclass
class Sink:
    """A capped buffer: keeps the first `cap` bytes and drains the rest so the writer never blocks on us."""

    cap: int
    data: bytearray = field(default_factory=bytearray)
    truncated: bool = False

    def feed(self, chunk: bytes) -> None:
        room = self.cap - len(self.data)
        if room > 0:
            self.data += chunk[:room]
        if len(chunk) > max(room, 0):
            self.truncated = True


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL `proc`'s whole process group; one that is gone already is fine."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def pump_output(
    proc: subprocess.Popen, sinks: dict[int, Sink], timeout_s: float, cancel: threading.Event | None = None
) -> bool:
    """Read every pipe until EOF, the deadline, a cancel, or shortly after the launcher exits. Returns timed_out
    (a cancelled run counts as timed out: its caller's deadline passed)."""
    sel = selectors.DefaultSelector()
    for fd in sinks:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    start = time.monotonic()
    deadline = start + timeout_s
    stop_at: float | None = None
    timed_out = False
    try:
        while sel.get_map():
            now = time.monotonic()
            if proc.poll() is not None and stop_at is None:
                stop_at = now + EXIT_DRAIN_S
            if not timed_out and stop_at is None and (now >= deadline or (cancel is not None and cancel.is_set())):
                timed_out = True
                kill_group(proc)
                stop_at = now + KILL_GRACE_S
            if stop_at is not None and now >= stop_at:
                break
            wait = (stop_at if stop_at is not None else deadline) - now
            for key, _ in sel.select(timeout=max(0.0, min(wait, 0.1))):
                try:
                    chunk = os.read(key.fd, 65536)
                except BlockingIOError:
                    continue
                if chunk:
                    sinks[key.fd].feed(chunk)
                else:
                    sel.unregister(key.fd)
    finally:
        sel.close()
    return timed_out


def collect_result(
    proc: subprocess.Popen,
    sinks: dict[int, Sink],
    timed_out: bool,
    t0: float,
    backend: str,
    uid: int | None,
    cg: RunCgroup | None,
    unavailable: dict[str, str],
) -> RunResult:
    """The finished (or killed) run as a RunResult: its capped output, exit code (signals as 128 + n, the way bwrap
    and sh report them), whether it timed out, was killed or ran out of memory."""
    try:
        rc = proc.wait(timeout=KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        rc = None
    assert proc.stdout is not None and proc.stderr is not None
    out, err = sinks[proc.stdout.fileno()], sinks[proc.stderr.fileno()]
    if rc is not None and rc < 0:
        rc = 128 - rc
    died_by_signal = rc is not None and 128 < rc <= 128 + 64
    return RunResult(
        stdout=out.data.decode("utf-8", "replace"),
        stderr=err.data.decode("utf-8", "replace"),
        exit_code=rc,
        timed_out=timed_out,
        killed=timed_out or died_by_signal,
        duration_s=round(time.monotonic() - t0, 4),
        isolation=backend,
        stdout_truncated=out.truncated,
        stderr_truncated=err.truncated,
        uid=uid,
        oom_killed=cg is not None and cg.oom_killed(),
        unavailable=unavailable,
    )
