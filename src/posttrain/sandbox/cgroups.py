"""A memory+pids cgroup per run, so that everything a run allocates is charged to the run.

RLIMIT_AS bounds one process's address space, but tmpfs pages, POSIX shared memory, memfd files and kernel
objects (inodes, dentries, pipes) belong to no process. Charged to a cgroup with a limit, they count against
the run, and when the run goes past it the kernel's OOM killer picks a process inside the run, never the
trainer. cgroup v1 (memory and pids hierarchies, as root) is tried first, then a delegated, writable v2.
"""

from __future__ import annotations

import functools
import os
import signal
import time
import uuid
from dataclasses import dataclass

V1 = "/sys/fs/cgroup"
V2_CANDIDATES = ("/sys/fs/cgroup/unified", "/sys/fs/cgroup")
PREFIX = "posttrain-sb-"


def _own_path(controller: str) -> str:
    """This process's cgroup path for a v1 controller ("" for v2 when controller is "")."""
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                _, ctrls, path = line.rstrip("\n").split(":", 2)
                if controller in ctrls.split(",") or (controller == "" and ctrls == ""):
                    return path
    except OSError:
        pass
    return "/"


def _parent_dirs() -> tuple[str, list[str]] | None:
    """("v1"|"v2", [dirs under which a run's cgroup is made]), nested under our own cgroup where it exists,
    so the limits of whatever runs us still apply above the run's."""
    dirs = []
    for ctrl in ("memory", "pids"):
        mount = os.path.join(V1, ctrl)
        if not os.path.exists(os.path.join(mount, "cgroup.procs")):
            break
        own = os.path.join(mount, _own_path(ctrl).lstrip("/"))
        dirs.append(own if os.access(own, os.W_OK) else mount)
    else:
        return "v1", dirs
    for root in V2_CANDIDATES:
        own = os.path.join(root, _own_path("").lstrip("/"))
        try:
            with open(os.path.join(own, "cgroup.subtree_control")) as f:
                enabled = f.read().split()
        except OSError:
            continue
        if {"memory", "pids"} <= set(enabled) and os.access(own, os.W_OK):
            return "v2", [own]
    return None


@functools.lru_cache(maxsize=1)
def probe() -> str | None:
    """None when per-run cgroups work here, else why not. Cached per process."""
    found = _parent_dirs()
    if found is None:
        return "no writable cgroup v1 memory+pids hierarchy and no delegated cgroup v2 with memory+pids"
    try:
        cg = RunCgroup.create(64 << 20, 8)
    except OSError as e:
        return f"cannot create a cgroup ({e})"
    cg.remove()
    return None


@dataclass
class RunCgroup:
    version: str
    dirs: list[str]

    @classmethod
    def create(cls, memory_bytes: int, max_pids: int) -> RunCgroup:
        found = _parent_dirs()
        if found is None:
            raise OSError("no usable cgroup hierarchy")
        version, parents = found
        name = PREFIX + uuid.uuid4().hex[:12]
        cg = cls(version, [os.path.join(p, name) for p in parents])
        try:
            for d in cg.dirs:
                os.mkdir(d, 0o700)
            if version == "v1":
                mem, pids = cg.dirs
                _write(mem, "memory.limit_in_bytes", memory_bytes)
                _write(mem, "memory.memsw.limit_in_bytes", memory_bytes, optional=True)  # no swap to hide in
                _write(pids, "pids.max", max_pids)
            else:
                _write(cg.dirs[0], "memory.max", memory_bytes)
                _write(cg.dirs[0], "memory.swap.max", 0, optional=True)
                _write(cg.dirs[0], "pids.max", max_pids)
        except OSError:
            cg.remove()
            raise
        return cg

    def procs_files(self) -> list[str]:
        return [os.path.join(d, "cgroup.procs") for d in self.dirs]

    def wrap(self, cmd: list[str]) -> list[str]:
        """`cmd` behind a shell that moves itself into the run's cgroups first, so every process the run ever
        has starts inside them (moving the pid after Popen would race the first fork)."""
        files = self.procs_files()
        script = " && ".join(f'echo 0 > "${i + 1}"' for i in range(len(files)))
        return ["/bin/sh", "-c", f'{script} && shift {len(files)} && exec "$@"', "ptsb-cg", *files, *cmd]

    def pids(self) -> list[int]:
        out: set[int] = set()
        for f in self.procs_files():
            try:
                with open(f) as fh:
                    out.update(int(x) for x in fh.read().split())
            except (OSError, ValueError):
                pass
        return sorted(out)

    def oom_killed(self) -> bool:
        """True when the kernel killed a process of this run for going past the memory limit."""
        name = "memory.oom_control" if self.version == "v1" else "memory.events"
        try:
            with open(os.path.join(self.dirs[0], name)) as f:
                for line in f:
                    k, _, v = line.partition(" ")
                    if k == "oom_kill" and int(v) > 0:
                        return True
        except (OSError, ValueError):
            pass
        return False

    def kill_all(self, timeout_s: float = 2.0) -> None:
        """SIGKILL whatever is left in the run's cgroups, until they are empty or the time is up."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(0.01)

    def remove(self, timeout_s: float = 2.0) -> None:
        self.kill_all(timeout_s)
        for d in self.dirs:
            deadline = time.monotonic() + timeout_s
            while os.path.isdir(d):
                try:
                    os.rmdir(d)
                except FileNotFoundError:
                    break
                except OSError:  # EBUSY while the last killed processes are still exiting
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.01)


def _write(d: str, name: str, value: int, optional: bool = False) -> None:
    try:
        with open(os.path.join(d, name), "w") as f:
            f.write(str(value))
    except OSError:
        if not optional:
            raise
