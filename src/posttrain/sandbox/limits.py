"""Per-run uids, rlimits as `prlimit` arguments, and the last-resort sweep of a run's processes."""

from __future__ import annotations

import os
import random
import signal
import threading
import time

from posttrain.sandbox.config import SandboxConfig

# Every run gets its own uid, far above normal users. Two reasons: RLIMIT_NPROC counts every process of a uid,
# so a shared uid would let one run's fork bomb starve another run; and "all processes of uid U" then names
# exactly one run's processes, which makes the final sweep and the tests' survivor check precise.
UID_BASE = 1_500_000
UID_SPAN = 1_000_000
_uid_lock = threading.Lock()
_uids_in_use: set[int] = set()
_rng = random.Random()


def can_switch_uid() -> bool:
    """Only root can give a run its own uid; other callers run it under their own uid."""
    return os.geteuid() == 0


def allocate_uid() -> int:
    """A uid no other run in this process holds; random across processes so parallel test runs rarely meet."""
    with _uid_lock:
        while True:
            uid = UID_BASE + _rng.randrange(UID_SPAN)
            if uid not in _uids_in_use and not processes_of_uid(uid):
                _uids_in_use.add(uid)
                return uid


def release_uid(uid: int) -> None:
    with _uid_lock:
        _uids_in_use.discard(uid)


def prlimit_args(cfg: SandboxConfig) -> list[str]:
    """`prlimit` flags for the run. Soft CPU limit first (SIGXCPU), hard one second later (SIGKILL)."""
    mb = 1 << 20
    cpu = cfg.cpu_limit_s()
    return [
        f"--as={cfg.memory_mb * mb}",
        f"--cpu={cpu}:{cpu + 1}",
        f"--nproc={cfg.max_procs}",
        f"--fsize={cfg.max_file_mb * mb}",
        f"--nofile={cfg.max_open_files}",
        "--core=0",
        "--memlock=0",
        "--msgqueue=0",
    ]


def processes_of_uid(uid: int) -> list[int]:
    """Pids whose real or effective uid is `uid` (read from /proc; racy by nature, so callers loop)."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", "rb") as f:
                for line in f:
                    if line.startswith(b"Uid:"):
                        real, eff = line.split()[1:3]
                        if int(real) == uid or int(eff) == uid:
                            pids.append(int(name))
                        break
        except (FileNotFoundError, ProcessLookupError, PermissionError, ValueError):
            continue
    return pids


def sweep_uid(uid: int, timeout_s: float = 2.0) -> int:
    """SIGKILL every process of `uid` until none is left; returns how many kills were sent.

    Needed for the unsafe backend, where a setsid daemon leaves our process group and no pid namespace catches
    it. Bounded: a fork loop racing the sweep is itself bounded by RLIMIT_NPROC.
    """
    sent = 0
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pids = processes_of_uid(uid)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                sent += 1
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.01)
    return sent
