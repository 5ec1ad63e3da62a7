"""run_command: stage files, start the command under a backend, pump capped output, kill the tree, clean up."""

from __future__ import annotations

import contextlib
import hashlib
import os
import selectors
import shutil
import signal
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
    NS_LAYOUT,
    Layout,
    _roots_under_tmp,
    bwrap_argv,
    bwrap_command,
    probe_interpreter,
    resolve_backend,
    unshare_argv,
)
from posttrain.sandbox.cgroups import RunCgroup
from posttrain.sandbox.config import RunResult, SandboxConfig
from posttrain.sandbox.launch_script import Proc, chain, inner_script, rpc_fds
from posttrain.sandbox.limits import allocate_uid, can_switch_uid, release_uid, sweep_uid
from posttrain.sandbox.tools import SandboxUnavailable, tool

KILL_GRACE_S = 2.0  # after SIGKILL, how long we wait for pipes to close before giving up on them
EXIT_DRAIN_S = 0.5  # after the launcher exits, how long a leftover writer may keep our pipes open
STAGE_BYTES, STAGE_INODES = 256 << 20, 65536  # the staging tmpfs: inputs and tests, written by us
HERE = Path(__file__).parent
SECCOMP_EXEC, SECCOMP_BPF = "seccomp_exec.py", ".seccomp.bpf"
HOST_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}  # the launcher's own environment


@dataclass
class _Sink:
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


def _safe_relpath(name: str) -> str:
    norm = os.path.normpath(name)
    if not name or os.path.isabs(name) or norm.startswith("..") or norm in (".", ""):
        raise ValueError(f"file name {name!r} must be a relative path inside the work dir")
    return norm


def write_tree(root: str, files: Mapping[str, str | bytes], mode: int = 0o644) -> None:
    """Write `files` (relative path -> content) under `root`; dirs 0755 so the run's uid can read them."""
    for name, content in files.items():
        path = os.path.join(root, _safe_relpath(name))
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        data = content.encode() if isinstance(content, str) else bytes(content)
        with open(path, "wb") as f:
            f.write(data)
        os.chmod(path, mode)


def hash_tree(root: str) -> dict[str, str]:
    """Relative path -> sha256 of every file under root (the graders check pristine tests against this)."""
    out = {}
    for dirpath, _, filenames in os.walk(root):
        for n in filenames:
            path = os.path.join(dirpath, n)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
    return out


def hide_tree(root: str, uid: int) -> None:
    """What a grader knows, readable by the grading process's uid alone: owner `uid`, dirs 0500, files 0400.

    The hidden-data rule: in a two-process run the graded code runs under a second uid, and the pristine tests
    hold the asserted values. World-readable, a solution that opens them could return what they assert (the
    bind mount keeps these host owners and modes, so they hold inside the sandbox)."""
    for dirpath, _dirnames, filenames in os.walk(root):
        for n in filenames:
            os.chown(os.path.join(dirpath, n), uid, uid, follow_symlinks=False)
            os.chmod(os.path.join(dirpath, n), 0o400)
        os.chown(dirpath, uid, uid)
        os.chmod(dirpath, 0o500)


def _chown_tree(root: str, uid: int) -> None:
    for dirpath, dirnames, filenames in os.walk(root):
        os.chown(dirpath, uid, uid)
        for n in dirnames + filenames:
            os.chown(os.path.join(dirpath, n), uid, uid, follow_symlinks=False)


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


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


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


def _pump(
    proc: subprocess.Popen, sinks: dict[int, _Sink], timeout_s: float, cancel: threading.Event | None = None
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
                _kill_group(proc)
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


def _stage(
    stage: str,
    backend: str,
    uid: int | None,
    files: Mapping[str, str | bytes] | None,
    inputs: Mapping[str, str | bytes] | None,
    tests: Mapping[str, str | bytes] | None,
    hide_tests: bool,
) -> tuple[str, str | None, Layout]:
    """The run's files under `stage`: `in/` (an /etc for the run's user, the inputs, the files under `files/`),
    `tests/` when given (hidden from the solution's uid in a two-process run), and the layout the command sees
    (the unsafe backend works in copies under `stage`; the namespaced ones mount NS_LAYOUT)."""
    stage_in, stage_tests = os.path.join(stage, "in"), os.path.join(stage, "tests") if tests is not None else None
    os.makedirs(stage_in, mode=0o755)
    os.chmod(stage_in, 0o755)
    name = "sandbox" if uid is not None else "user"
    u, g = (uid, uid) if uid is not None else (os.getuid(), os.getgid())
    staged: dict[str, str | bytes] = {
        "etc/passwd": f"root:x:0:0::/:/bin/false\n{name}:x:{u}:{g}::/:/bin/false\n",
        "etc/group": f"root:x:0:\n{name}:x:{g}:\n",
    }
    staged.update(inputs or {})
    staged.update({f"files/{k}": v for k, v in (files or {}).items()})
    write_tree(stage_in, staged)
    if stage_tests is not None:
        os.makedirs(stage_tests, mode=0o755)
        write_tree(stage_tests, tests or {})
        if hide_tests and uid is not None:
            hide_tree(stage_tests, uid)
    if backend != "unsafe":
        return stage_in, stage_tests, NS_LAYOUT
    layout = Layout(work=f"{stage}/work", tmp=f"{stage}/tmp", inputs=stage_in, tests=stage_tests or "")
    shutil.copytree(os.path.join(stage_in, "files"), layout.work, dirs_exist_ok=True) if os.path.isdir(
        os.path.join(stage_in, "files")
    ) else os.makedirs(layout.work)
    os.makedirs(layout.tmp)
    if uid is not None:
        _chown_tree(layout.work, uid)
        _chown_tree(layout.tmp, uid)
    return stage_in, stage_tests, layout


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


def _result(
    proc: subprocess.Popen,
    sinks: dict[int, _Sink],
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
    unavailable: dict[str, str] = {}
    mounted: list[str] = []
    launch_fds: list[int] = []
    cg: RunCgroup | None = None
    read_fd = write_fd = stdin = -1
    proc: subprocess.Popen | None = None
    try:
        os.chmod(stage, 0o711)
        box_dir = None
        if backend != "unsafe":
            mounted = _mount_private(stage, cfg, bool(_roots_under_tmp(interp)), unavailable)
            box_dir = mounted[0] if mounted and backend == "bwrap" else None
            if backend == "unshare":
                unavailable.pop("inode_cap", None)  # the unshare script mounts its own capped tmpfs
        stage_in, stage_tests, layout = _stage(
            stage, backend, uid, files, inputs, tests, hide_tests=companion_fn is not None
        )
        if argv_fn is not None:
            argv = argv_fn(layout)
        companion_argv = companion_fn(layout) if companion_fn is not None else None
        if argv and "=" in argv[0]:
            raise ValueError(f"argv[0] {argv[0]!r} contains '=', which env(1) would read as a variable")
        pass_fds: list[int] = []
        if result_channel:
            read_fd, write_fd = os.pipe()
            pass_fds.append(write_fd)
        # Only the result fd survives into the sandbox's shell (bwrap closes its --args and --seccomp fds).
        rpc_pair = rpc_fds([write_fd])
        rpc = {"{result_fd}": str(write_fd), "{rpc_req}": str(rpc_pair[0]), "{rpc_reply}": str(rpc_pair[1])}

        def fill(args: list[str]) -> list[str]:
            for k, v in rpc.items():
                args = [a.replace(k, v) for a in args]
            return args

        env = _base_env(cfg, layout, interp.path)
        if companion_argv is None:
            main = Proc(fill(argv), env, uid, layout.work)
            companion = None
        else:
            main = Proc(fill(argv), {**env, "HOME": layout.runner, "TMPDIR": layout.runner}, uid, layout.runner)
            companion = Proc(fill(companion_argv), env, uid2, layout.work)
        bpf, why = seccomp_filter.build() if backend != "unsafe" else (None, "the unsafe backend has no sandbox")
        if bpf is None:
            unavailable["seccomp"] = why or "unknown"
        if backend == "unsafe":
            cmd = chain(cfg, main)
        else:
            cmd, launch_fds, stdin = _namespaced_command(
                cfg,
                backend,
                interp,
                layout,
                stage,
                stage_in,
                stage_tests,
                box_dir,
                main,
                companion,
                bpf,
                write_fd,
                rpc_pair,
            )
        pass_fds += launch_fds
        cg = _run_cgroup(cfg, unavailable)
        if cg is not None:
            cmd = cg.wrap(cmd)
        t0 = time.monotonic()
        proc = subprocess.Popen(
            cmd,
            stdin=stdin if stdin >= 0 else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=tuple(pass_fds),
            start_new_session=True,
            close_fds=True,
            env=HOST_ENV,
        )
        for fd in [write_fd, stdin, *launch_fds]:
            if fd >= 0:
                os.close(fd)
        write_fd, stdin, launch_fds = -1, -1, []
        assert proc.stdout is not None and proc.stderr is not None
        sinks = {proc.stdout.fileno(): _Sink(cfg.max_output_bytes), proc.stderr.fileno(): _Sink(cfg.max_output_bytes)}
        if read_fd >= 0:
            sinks[read_fd] = _Sink(cfg.max_result_bytes)
        timed_out = _pump(proc, sinks, cfg.timeout_s, getattr(_cancel, "event", None))
        _kill_group(proc)  # whatever is left of the launcher's group; the namespace died with its pid 1
        res = _result(proc, sinks, timed_out, t0, backend, uid, cg, unavailable)
        result_bytes = bytes(sinks[read_fd].data) if read_fd >= 0 else b""
        return res, result_bytes, hash_tree(stage_tests) if stage_tests is not None else {}
    finally:
        if proc is not None:
            for f in (proc.stdout, proc.stderr):
                if f is not None:
                    f.close()
            if proc.poll() is None:
                _kill_group(proc)
        for fd in (read_fd, write_fd, stdin, *launch_fds):
            if fd >= 0:
                os.close(fd)
        if cg is not None:
            cg.remove()
        for u in (uid, uid2):
            if u is not None:
                sweep_uid(u)
                release_uid(u)
        for m in mounted:
            mounts.unmount(m)
        shutil.rmtree(stage, ignore_errors=True)


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
