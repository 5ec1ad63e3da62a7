"""What a process leaves on the host, named for its owner so that the next process can remove it when the owner was
killed outright (SIGKILL, the OOM killer, a scheduler killing the job): no finalizer runs then.

    alive(pid)                        a live process (a zombie is not)
    ns_tag()                          6 hex digits naming this pid namespace: a pid from another one says nothing
    OwnedDir.create(prefix)           a private directory (mode 0700) `<prefix><pid>-<ns tag>-<random>`; dead owners'
                                      directories of that prefix swept first; removed at `remove()`, when collected,
                                      at exit, never by a forked child
    sweep_dirs(prefix, base)          remove this user's `prefix` directories whose owner is no longer alive

Users: sampling/shm_blocks.py (shared-memory blocks, its own names), cluster/server_sockets.py (the vLLM servers'
socket directory), sampling/engines.py (an in-process engine's written model folder). Imports only the stdlib.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import tempfile
import weakref
import zlib
from pathlib import Path


def alive(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie, killed but not yet reaped, is not)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: alive
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            st = f.read(4096)
    except OSError:  # no /proc: trust the signal probe
        return True
    end = st.rfind(b")")  # "pid (comm) S ...": the command may hold spaces and parentheses
    return st[end + 2 : end + 3] != b"Z"


def ns_tag() -> str:
    """6 hex digits naming this process's pid namespace (000000 where there is no /proc)."""
    try:
        ns = os.readlink("/proc/self/ns/pid")
    except OSError:
        return "000000"
    return f"{zlib.crc32(ns.encode()) & 0xFFFFFF:06x}"


def _pattern(prefix: str) -> re.Pattern[str]:
    return re.compile(rf"{re.escape(prefix)}(\d{{1,10}})-([0-9a-f]{{6}})-[a-z0-9_]{{8}}")


def sweep_dirs(prefix: str, base: str) -> list[str]:
    """Remove this user's `prefix` directories in `base` of this pid namespace whose owner is no longer alive;
    returns their names. A link or another user's directory is never followed or touched."""
    try:
        names = os.listdir(base)
    except OSError:
        return []
    pattern, tag, uid, removed = _pattern(prefix), ns_tag(), os.geteuid(), []
    for name in names:
        m = pattern.fullmatch(name)
        if m is None or m.group(2) != tag or alive(int(m.group(1))):
            continue
        path = os.path.join(base, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid:
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(name)
    return removed


class OwnedDir:
    """A private directory of this process (module docstring)."""

    def __init__(self, path: Path):
        self.path = path
        self._finalizer = weakref.finalize(self, _remove_dir, str(path), os.getpid())

    @classmethod
    def create(cls, prefix: str, base: str | None = None) -> OwnedDir:
        base = base or tempfile.gettempdir()
        sweep_dirs(prefix, base)
        path = Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-{ns_tag()}-", dir=base))  # mkdtemp: mode 0700
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) != 0o700:
            shutil.rmtree(path, ignore_errors=True)
            raise RuntimeError(f"{path} is not a private directory of this user (mode {oct(st.st_mode)})")
        return cls(path)

    def remove(self) -> None:
        """The directory and everything in it; idempotent."""
        self._finalizer()


def _remove_dir(path: str, creator_pid: int) -> None:
    if os.getpid() != creator_pid:  # a forked child exiting: the directory is its parent's
        return
    shutil.rmtree(path, ignore_errors=True)
