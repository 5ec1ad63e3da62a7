"""Supervised server processes: each in its own process group (session) behind a watchdog, so that killing it
reaches every process it forked, and nothing it started outlives this process.

    server = spawn_supervised(cmd, env, socket, log_path) the command under the watchdog, logging to a file
    kill_group(server)                                    SIGTERM, then SIGKILL to the whole group; waits until empty
    close_servers(servers)                                every group killed at once
    log_tail(path)                                        the end of a server's log, for error messages

cluster/vllm_servers.py runs vLLM's API servers this way (an API server forks an engine core and workers), each
listening on a Unix socket in the pool's private directory (cluster/server_sockets.py).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posttrain.cluster.group_shm import mapped_by_group, remove_unmapped
from posttrain.cluster.server_sockets import url_of

# The watchdog each server runs under, as the leader of the server's process group. It starts the server, and when
# the server exits (a crash) or this process disappears (the parent pid changes) it kills the whole group, so no
# engine-core or worker process outlives either. SIGTERM is left to the server (a graceful shutdown); the group is
# killed once the server has gone. When this process disappeared, the watchdog also removes the private directory
# it was given (the pool's sockets, cluster/server_sockets.py), which no finalizer of a killed process removes; and
# either way, the /dev/shm files the group mapped that no process maps once it is gone (cluster/group_shm.py).
WATCHDOG = r"""
import os, shutil, signal, subprocess, sys
parent, private = int(sys.argv[1]), sys.argv[2]
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen(sys.argv[3:], preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL))
while True:
    try:
        rc = child.wait(timeout=1.0)
        break
    except subprocess.TimeoutExpired:
        if os.getppid() != parent:
            if private:
                shutil.rmtree(private, ignore_errors=True)
            break
try:  # what the group maps in /dev/shm, removed once the rest of the group is gone (cluster/group_shm.py)
    from posttrain.cluster.group_shm import kill_members, mapped_by_group, remove_unmapped
    names = mapped_by_group(os.getpgid(0))
    kill_members(os.getpgid(0), keep=os.getpid())
    remove_unmapped(names)
except Exception:
    pass
os.killpg(0, signal.SIGKILL)
"""


@dataclass
class Server:
    """One server process (one incarnation of a slot)."""

    proc: subprocess.Popen  # the watchdog, leader of the server's process group
    socket: Path  # the Unix socket it listens on (cluster/server_sockets.py)
    log_path: Path
    killed: bool = False  # its group was killed: never signal that process group id again (it may be reused)
    shm: set[str] = field(default_factory=set)  # what its group was seen to map in /dev/shm (cluster/group_shm.py)
    shm_served: bool = False  # `shm` was noted after it first served (vllm_servers._note_shm)

    @property
    def url(self) -> str:
        """Its base URL for a client whose transport is the pool's SocketRoutes (the host names the socket)."""
        return url_of(self.socket)

    @property
    def pgid(self) -> int:
        return self.proc.pid  # start_new_session: the watchdog leads its own group

    def alive(self) -> bool:
        return self.proc.poll() is None


def spawn_supervised(
    cmd: list[str],
    env: dict[str, str],
    socket: Path,
    log_path: Path,
    cwd: str | Path | None = None,
    private_dir: Path | None = None,
) -> Server:
    """`cmd` (a server that will listen on `socket`) started under the watchdog in a new session, stdout and stderr
    appended to `log_path` (the command line first); `private_dir` is removed by the watchdog if this process
    disappears. Returns at once: the caller waits for the server to be ready."""
    with open(log_path, "ab") as f:
        f.write(f"$ {' '.join(cmd)}\n".encode())
        f.flush()
        proc = subprocess.Popen(
            [sys.executable, "-c", WATCHDOG, str(os.getpid()), str(private_dir or ""), *cmd],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=cwd,
        )
    return Server(proc, socket, log_path)


def kill_group(server: Server, grace_s: float = 10.0) -> None:
    """SIGTERM the server (a graceful shutdown frees its shared memory), then SIGKILL the whole group: the watchdog
    leads it, so this also reaches an engine core whose API server is already gone. What the group mapped in
    /dev/shm and nothing maps once it is gone is removed (a killed vLLM leaves its broadcast blocks)."""
    if server.killed:
        return
    server.killed = True
    proc = server.proc
    names = server.shm | (mapped_by_group(proc.pid) if proc.poll() is None else set())  # removed below
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace_s)
    deadline = time.monotonic() + grace_s  # until the group is empty: its memory is free when this returns
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except (ProcessLookupError, PermissionError):
            break
        time.sleep(0.1)
    remove_unmapped(names)


def note_shm(server: Server, again: bool = False) -> None:
    """What a serving server maps in /dev/shm, added to what it is known to map (after its first answer, and at
    each push when `again`): what vLLM creates lazily (its semaphores on the first request) is then removed too
    when its whole group is killed at once (cluster/group_shm.py)."""
    if again or not server.shm_served:
        server.shm |= mapped_by_group(server.pgid)
        server.shm_served = True


def log_tail(path: Path, n: int = 30) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(lines[-n:])


def close_servers(servers: Iterable[Any]) -> None:
    """Kill every server's process group, all at once (each waits a grace period). Takes Servers, or anything
    with a `.server` (a pool's slots)."""
    targets = [getattr(s, "server", s) for s in servers]
    threads = [threading.Thread(target=kill_group, args=(t,), daemon=True) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)


class ServerPoolError(RuntimeError):
    """The pool could not get a call's completions or push a version: every server is retired, or a share or a
    push failed more often than the restarts allow."""


class ServerFailed(ServerPoolError):
    """One server did not do what was asked (dead, hung, a 5xx, a wrong answer): the caller restarts it."""


@dataclass
class Slot:
    """A place for one server; the server in it is replaced when it dies or hangs."""

    rank: int
    server: Server
    incarnation: int = 0  # restarts so far
    retired: bool = False
    lock: threading.RLock = field(default_factory=threading.RLock)  # a push and a restart of this slot take turns
