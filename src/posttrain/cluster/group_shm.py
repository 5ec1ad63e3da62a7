"""The /dev/shm entries a server's process group leaves when it is killed, found and removed.

vLLM's processes talk through multiprocessing shared memory (its broadcast queues: blocks of 160-240 MB) and POSIX
semaphores, both files in /dev/shm that only a graceful shutdown removes. A server killed outright (a restart of a
hung server, the pool's close after its grace period, the watchdog after the trainer died) left them behind: 13 such
blocks, 3.0 GB of RAM, after one test run. So whoever kills a group first notes what its processes map in /dev/shm
(`mapped_by_group`), and once they are gone removes each entry no live process still maps (`remove_unmapped`).
Blocks named `posttrain_` are the trainer's own (sampling/shm_blocks.py), never touched here.

Imports only the stdlib: the watchdog (server_processes.py) runs it with nothing else loaded.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

SHM = "/dev/shm/"
OWN_PREFIX = "posttrain_"  # the trainer's weight blocks: owned and swept by sampling/shm_blocks.py


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _shm_maps(pid: int) -> set[str]:
    """The /dev/shm files `pid` maps (a deleted one is already gone and is skipped)."""
    names: set[str] = set()
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                parts = line.rstrip("\n").split(None, 5)
                if len(parts) == 6 and parts[5].startswith(SHM) and not parts[5].endswith(" (deleted)"):
                    names.add(parts[5])
    except OSError:  # gone, or not ours to read
        pass
    return names


def mapped_by_group(pgid: int) -> set[str]:
    """The /dev/shm files the live processes of process group `pgid` map, except posttrain's own blocks."""
    names: set[str] = set()
    for pid in _pids():
        try:
            if os.getpgid(pid) != pgid:
                continue
        except OSError:
            continue
        names |= _shm_maps(pid)
    return {n for n in names if not os.path.basename(n).startswith(OWN_PREFIX)}


def kill_members(pgid: int, keep: int, wait_s: float = 10.0) -> None:
    """SIGKILL every process of group `pgid` but `keep` (the caller), and wait (at most `wait_s`) until they are
    gone, so that what they mapped can be judged unmapped."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        members = []
        for pid in _pids():
            try:
                if pid != keep and os.getpgid(pid) == pgid:
                    members.append(pid)
            except OSError:
                continue
        if not members:
            return
        for pid in members:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def remove_unmapped(names: set[str]) -> list[str]:
    """Remove each of `names` that no live process maps any more; returns those removed."""
    if not names:
        return []
    still: set[str] = set()
    for pid in _pids():
        still |= _shm_maps(pid) & names
    removed = []
    for n in sorted(names - still):
        try:
            os.unlink(n)
            removed.append(n)
        except OSError:  # removed by its owner meanwhile, or not ours
            pass
    return removed
