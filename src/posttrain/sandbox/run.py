"""run_command: stage files, start the command under a backend, pump capped output, kill the tree, clean up.

The staging of files lives in staging.py, the pumping of output and the RunResult in output.py."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from posttrain.sandbox import cgroups, mounts, seccomp_filter
from posttrain.sandbox.backends import (
    BOX,
    LAUNCH,
    Interpreter,
    Layout,
    bwrap_argv,
    bwrap_command,
    probe_interpreter,
    resolve_backend,
    roots_under_tmp,
    unshare_argv,
)
from posttrain.sandbox.cgroups import RunCgroup
from posttrain.sandbox.config import RunResult, SandboxConfig
from posttrain.sandbox.launch_script import Proc, chain, inner_script, rpc_fds
from posttrain.sandbox.limits import allocate_uid, can_switch_uid, release_uid, sweep_uid
from posttrain.sandbox.output import Sink, collect_result, kill_group, pump_output
from posttrain.sandbox.staging import hash_tree, stage_files, write_tree
from posttrain.sandbox.tools import SandboxUnavailable, tool

STAGE_BYTES, STAGE_INODES = 256 << 20, 65536  # the staging tmpfs: inputs and tests, written by us
HERE = Path(__file__).parent
SECCOMP_EXEC, SECCOMP_BPF = "seccomp_exec.py", ".seccomp.bpf"
HOST_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}  # the launcher's own environment


def _base_env(cfg: SandboxConfig, layout: Layout, python: str) -> dict[str, str]:
    env = {
        "PATH": f"{os.path.dirname(python)}:/usr/local/bin:/usr/bin:/bin",
        "HOME": layout.work,
        "TMPDIR": layout.tmp,
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONHASHSEED": "0",
    }
    env.update(cfg.env)
    return env


# The cancel event of the runs this thread starts (SandboxPool sets it around each call it hands a thread): a
# caller that stops waiting sets it, and the run kills its sandbox at the next pump tick instead of running on
# unseen past the caller's timeout. Thread-local, so the graders between the pool and run_sandboxed need no
# extra argument.
_cancel = threading.local()


@contextlib.contextmanager
def cancel_on(event: threading.Event) -> Iterator[threading.Event]:
    """Sandboxed runs started by this thread inside the block end (killed) soon after `event` is set."""
    previous = getattr(_cancel, "event", None)
    _cancel.event = event
    try:
        yield event
    finally:
        _cancel.event = previous


def _memfd(name: str, data: bytes) -> int:
    """An fd holding `data`, positioned at its start, for a launcher to read (never a path on a command line)."""
    fd = os.memfd_create(name)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _mount_private(stage: str, cfg: SandboxConfig, half_box: bool, unavailable: dict[str, str]) -> list[str]:
    """Put the staging dir on a tmpfs of its own and make the box a tmpfs with an inode cap; returns the mount
    points to undo. Where this process cannot mount, says so in `unavailable` and returns what it managed."""
    why = mounts.probe(os.path.dirname(stage)) if can_switch_uid() else "mounting needs root"
    if why is not None:
        unavailable["private_staging"] = unavailable["inode_cap"] = why
        return []
    done: list[str] = []
    try:
        mounts.mount_tmpfs(stage, STAGE_BYTES, STAGE_INODES, mode=0o711)
        done.insert(0, stage)
        box = os.path.join(stage, "box")
        os.mkdir(box, 0o755)
        mounts.mount_tmpfs(box, cfg.tmpfs_mb << (19 if half_box else 20), cfg.max_inodes, mode=0o755)
        done.insert(0, box)
    except OSError as e:  # e.g. the mount table is full: run without, and say so
        for m in done:
            mounts.unmount(m)
        unavailable["private_staging"] = unavailable["inode_cap"] = str(e)
        return []
    return done


def _namespaced_command(
    cfg: SandboxConfig,
    backend: str,
    interp,
    layout: Layout,
    stage: str,
    stage_in: str,
    stage_tests: str | None,
    box_dir: str | None,
    main: Proc,
    companion: Proc | None,
    bpf: bytes | None,
    result_fd: int,
    rpc_pair: tuple[int, int],
) -> tuple[list[str], list[int], int]:
    """The host argv for bwrap or unshare, the fds it must inherit, and an fd for its stdin (-1: none).

    Writes the root-only launch script into the staged inputs. Nothing that names a host path or holds an
    environment value goes on a command line: bwrap reads its options from a memfd, unshare its mount script
    from stdin, and both run /in/.launch.sh.
    """
    launch_fds: list[int] = []
    stdin = -1
    if backend == "bwrap" and bpf is not None:
        launch_fds.append(_memfd("ptsb-seccomp", bpf))
    elif bpf is not None:  # unshare: a loader in the launch chain, reading a root-only copy
        write_tree(stage_in, {SECCOMP_BPF: bpf, SECCOMP_EXEC: (HERE / SECCOMP_EXEC).read_bytes()}, mode=0o600)
        for p in (main, companion):
            if p is not None:
                p.pre = [
                    interp.path,
                    "-I",
                    "-S",
                    f"{layout.inputs}/{SECCOMP_EXEC}",
                    f"{layout.inputs}/{SECCOMP_BPF}",
                    "--",
                ]
    if backend == "bwrap":
        args = bwrap_argv(
            cfg, interp, layout, stage_in, stage_tests, box_dir, main.uid is None, launch_fds[0] if launch_fds else None
        )
        launch_fds.append(_memfd("ptsb-args", b"".join(a.encode() + b"\0" for a in args)))
        cmd = [tool("bwrap"), "--args", str(launch_fds[-1]), *bwrap_command(layout)]
    else:
        root_dir = os.path.join(stage, "root")
        os.makedirs(root_dir)
        cmd, mount_script = unshare_argv(cfg, interp, layout, stage_in, stage_tests, root_dir, main.uid is None)
        stdin = _memfd("ptsb-mounts", mount_script.encode())
    script = inner_script(
        cfg,
        BOX,
        layout.work,
        layout.tmp,
        layout.inputs,
        main,
        companion,
        close_fds=tuple(launch_fds),
        result_fd=result_fd if result_fd >= 0 else None,
        runner=layout.runner,
        rpc_dir=layout.rpc,
        rpc=rpc_pair,
    )
    with open(os.open(os.path.join(stage_in, LAUNCH), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o700), "w") as f:
        f.write(script)
    return cmd, launch_fds, stdin


def _run_cgroup(cfg: SandboxConfig, unavailable: dict[str, str]) -> RunCgroup | None:
    """The run's own cgroup (memory and pids caps) where cgroups work here; otherwise None and why in
    `unavailable`."""
    why = cgroups.probe() if can_switch_uid() else "cgroups need root here"
    if why is None:
        try:
            return RunCgroup.create(cfg.run_memory_mb << 20, 2 * cfg.max_procs + 16)
        except OSError as e:
            why = f"cannot create the run's cgroup: {e}"
    unavailable["cgroup"] = why
    return None


@dataclass
class _Run:
    """One run's settings and what it holds until it ends: `release` gives back whatever it got to."""

    cfg: SandboxConfig
    backend: str
    interp: Interpreter
    stage: str
    uid: int | None
    uid2: int | None
    unavailable: dict[str, str] = field(default_factory=dict)
    mounted: list[str] = field(default_factory=list)
    box_dir: str | None = None
    read_fd: int = -1
    write_fd: int = -1
    stdin: int = -1
    launch_fds: list[int] = field(default_factory=list)
    cg: RunCgroup | None = None
    proc: subprocess.Popen | None = None
    t0: float = 0.0

    def mount(self) -> None:
        """A namespaced run's private staging tmpfs and capped box (what could not be mounted: in `unavailable`)."""
        if self.backend == "unsafe":
            return
        self.mounted = _mount_private(self.stage, self.cfg, bool(roots_under_tmp(self.interp)), self.unavailable)
        self.box_dir = self.mounted[0] if self.mounted and self.backend == "bwrap" else None
        if self.backend == "unshare":
            self.unavailable.pop("inode_cap", None)  # the unshare script mounts its own capped tmpfs

    def procs(
        self, layout: Layout, argv: list[str], companion_argv: list[str] | None, rpc_pair: tuple[int, int]
    ) -> tuple[Proc, Proc | None]:
        """The main process and the companion (None: none), "{result_fd}", "{rpc_req}" and "{rpc_reply}" filled in;
        beside a companion, the main process gets a private home."""
        rpc = {"{result_fd}": str(self.write_fd), "{rpc_req}": str(rpc_pair[0]), "{rpc_reply}": str(rpc_pair[1])}

        def fill(args: list[str]) -> list[str]:
            for k, v in rpc.items():
                args = [a.replace(k, v) for a in args]
            return args

        env = _base_env(self.cfg, layout, self.interp.path)
        if companion_argv is None:
            return Proc(fill(argv), env, self.uid, layout.work), None
        main = Proc(fill(argv), {**env, "HOME": layout.runner, "TMPDIR": layout.runner}, self.uid, layout.runner)
        return main, Proc(fill(companion_argv), env, self.uid2, layout.work)

    def command(
        self,
        layout: Layout,
        stage_in: str,
        stage_tests: str | None,
        main: Proc,
        companion: Proc | None,
        rpc_pair: tuple[int, int],
    ) -> list[str]:
        """The host command: the launch chain itself (unsafe) or bwrap / unshare with the seccomp filter where it
        builds, inside the run's own cgroup where there is one."""
        bpf, why = seccomp_filter.build() if self.backend != "unsafe" else (None, "the unsafe backend has no sandbox")
        if bpf is None:
            self.unavailable["seccomp"] = why or "unknown"
        if self.backend == "unsafe":
            cmd = chain(self.cfg, main)
        else:
            cmd, self.launch_fds, self.stdin = _namespaced_command(
                self.cfg,
                self.backend,
                self.interp,
                layout,
                self.stage,
                stage_in,
                stage_tests,
                self.box_dir,
                main,
                companion,
                bpf,
                self.write_fd,
                rpc_pair,
            )
        self.cg = _run_cgroup(self.cfg, self.unavailable)
        return self.cg.wrap(cmd) if self.cg is not None else cmd

    def start(self, cmd: list[str]) -> None:
        """Start `cmd` in a session of its own, then close our copies of the fds it inherited."""
        pass_fds = ([self.write_fd] if self.write_fd >= 0 else []) + self.launch_fds
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(
            cmd,
            stdin=self.stdin if self.stdin >= 0 else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=tuple(pass_fds),
            start_new_session=True,
            close_fds=True,
            env=HOST_ENV,
        )
        for fd in [self.write_fd, self.stdin, *self.launch_fds]:
            if fd >= 0:
                os.close(fd)
        self.write_fd, self.stdin, self.launch_fds = -1, -1, []

    def collect(self) -> tuple[RunResult, bytes]:
        """Pump the output until the run ends, times out or is cancelled, kill what is left: the RunResult and what
        came through the result channel."""
        proc = self.proc
        assert proc is not None and proc.stdout is not None and proc.stderr is not None
        cap = self.cfg.max_output_bytes
        sinks = {proc.stdout.fileno(): Sink(cap), proc.stderr.fileno(): Sink(cap)}
        if self.read_fd >= 0:
            sinks[self.read_fd] = Sink(self.cfg.max_result_bytes)
        timed_out = pump_output(proc, sinks, self.cfg.timeout_s, getattr(_cancel, "event", None))
        kill_group(proc)  # whatever is left of the launcher's group; the namespace died with its pid 1
        res = collect_result(proc, sinks, timed_out, self.t0, self.backend, self.uid, self.cg, self.unavailable)
        return res, bytes(sinks[self.read_fd].data) if self.read_fd >= 0 else b""

    def release(self) -> None:
        """Give back what the run got to, in order: its process and pipes, fds, cgroup, uids, mounts, staging dir."""
        if self.proc is not None:
            for f in (self.proc.stdout, self.proc.stderr):
                if f is not None:
                    f.close()
            if self.proc.poll() is None:
                kill_group(self.proc)
        for fd in (self.read_fd, self.write_fd, self.stdin, *self.launch_fds):
            if fd >= 0:
                os.close(fd)
        if self.cg is not None:
            self.cg.remove()
        for u in (self.uid, self.uid2):
            if u is not None:
                sweep_uid(u)
                release_uid(u)
        for m in self.mounted:
            mounts.unmount(m)
        shutil.rmtree(self.stage, ignore_errors=True)


def run_sandboxed(
    argv: list[str],
    files: Mapping[str, str | bytes] | None,
    cfg: SandboxConfig,
    *,
    inputs: Mapping[str, str | bytes] | None = None,
    tests: Mapping[str, str | bytes] | None = None,
    result_channel: bool = False,
    argv_fn=None,
    companion_fn=None,
) -> tuple[RunResult, bytes, dict[str, str]]:
    """The engine behind run_command and the graders.

    `inputs` land read-only in `layout.inputs`, `tests` read-only in `layout.tests`. With `result_channel`, a
    pipe's write end is passed to the command and its fd number replaces "{result_fd}" in argv; what comes
    through it is returned, capped at cfg.max_result_bytes. `argv_fn(layout)` may build argv from the layout.
    `companion_fn(layout)`, when given, is the argv of a second process (the solution, in out-of-process
    grading): it gets the work dir and a uid of its own, never the result fd; the main process gets a private
    home; "{rpc_req}" and "{rpc_reply}" in either argv are the pipe fds between them (see launch_script.py).
    Needs a namespaced backend and root. Returns (run result, result-channel bytes, sha256 of every file in
    the staged tests dir after the run).
    """
    backend = resolve_backend(cfg)
    if companion_fn is not None and (backend == "unsafe" or not can_switch_uid()):
        raise SandboxUnavailable("a two-process run needs a namespaced backend and root (a uid per process)")
    interp = probe_interpreter(cfg.python)
    base = cfg.staging_dir or tempfile.gettempdir()
    stage = tempfile.mkdtemp(prefix="posttrain-sb-", dir=base)
    uid = allocate_uid() if can_switch_uid() else None
    uid2 = allocate_uid() if companion_fn is not None else None
    run = _Run(cfg, backend, interp, stage, uid, uid2)
    try:
        os.chmod(stage, 0o711)
        run.mount()
        stage_in, stage_tests, layout = stage_files(
            stage, backend, uid, files, inputs, tests, hide_tests=companion_fn is not None
        )
        if argv_fn is not None:
            argv = argv_fn(layout)
        companion_argv = companion_fn(layout) if companion_fn is not None else None
        if argv and "=" in argv[0]:
            raise ValueError(f"argv[0] {argv[0]!r} contains '=', which env(1) would read as a variable")
        if result_channel:
            run.read_fd, run.write_fd = os.pipe()
        # Only the result fd survives into the sandbox's shell (bwrap closes its --args and --seccomp fds).
        rpc_pair = rpc_fds([run.write_fd])
        main, companion = run.procs(layout, argv, companion_argv, rpc_pair)
        run.start(run.command(layout, stage_in, stage_tests, main, companion, rpc_pair))
        res, result_bytes = run.collect()
        return res, result_bytes, hash_tree(stage_tests) if stage_tests is not None else {}
    finally:
        run.release()


def run_command(
    argv: list[str], files: Mapping[str, str | bytes] | None = None, cfg: SandboxConfig | None = None
) -> RunResult:
    """Run `argv` in a fresh sandbox whose work dir (the cwd) holds `files`. Never raises for what the command does.

    Raises SandboxUnavailable when the configured backend cannot run here, or when only the limits-only backend
    is left and `cfg.allow_unsafe` is False.
    """
    cfg = cfg or SandboxConfig()
    res, _, _ = run_sandboxed(list(argv), files, cfg)
    return res
