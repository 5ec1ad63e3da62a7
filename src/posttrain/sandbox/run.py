"""run_command: stage files, start the command under a backend, pump capped output, kill the tree, clean up."""

from __future__ import annotations

import hashlib
import os
import selectors
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field

from posttrain.sandbox.backends import (
    NS_LAYOUT,
    Layout,
    bwrap_argv,
    probe_interpreter,
    resolve_backend,
    unsafe_argv,
    unshare_argv,
)
from posttrain.sandbox.config import RunResult, SandboxConfig
from posttrain.sandbox.limits import allocate_uid, can_switch_uid, release_uid, sweep_uid

KILL_GRACE_S = 2.0  # after SIGKILL, how long we wait for pipes to close before giving up on them
EXIT_DRAIN_S = 0.5  # after the launcher exits, how long a leftover writer may keep our pipes open


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


def write_tree(root: str, files: dict[str, str | bytes], mode: int = 0o644) -> None:
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


def _chown_tree(root: str, uid: int) -> None:
    for dirpath, dirnames, filenames in os.walk(root):
        os.chown(dirpath, uid, uid)
        for n in dirnames + filenames:
            os.chown(os.path.join(dirpath, n), uid, uid, follow_symlinks=False)


def _base_env(cfg: SandboxConfig, layout: Layout, python: str) -> dict[str, str]:
    env = {"PATH": f"{os.path.dirname(python)}:/usr/local/bin:/usr/bin:/bin", "HOME": layout.work,
           "TMPDIR": layout.tmp, "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0"}
    env.update(cfg.env)
    return env


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _pump(proc: subprocess.Popen, sinks: dict[int, _Sink], timeout_s: float) -> bool:
    """Read every pipe until EOF, the deadline, or shortly after the launcher exits. Returns timed_out."""
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
            if not timed_out and stop_at is None and now >= deadline:
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


def run_sandboxed(argv: list[str], files: dict[str, str | bytes] | None, cfg: SandboxConfig, *,
                  inputs: dict[str, str | bytes] | None = None, tests: dict[str, str | bytes] | None = None,
                  result_channel: bool = False, argv_fn=None) -> tuple[RunResult, bytes, dict[str, str]]:
    """The engine behind run_command and the graders.

    `inputs` land read-only in `layout.inputs`, `tests` read-only in `layout.tests`. With `result_channel`, a
    pipe's write end is passed to the command and its fd number replaces "{result_fd}" in argv; what comes
    through it is returned, capped at cfg.max_result_bytes. `argv_fn(layout)` may build argv from the layout.
    Returns (run result, result-channel bytes, sha256 of every file in the staged tests dir after the run).
    """
    backend = resolve_backend(cfg)
    interp = probe_interpreter(cfg.python)
    base = cfg.staging_dir or tempfile.gettempdir()
    stage = tempfile.mkdtemp(prefix="posttrain-sb-", dir=base)
    uid = allocate_uid() if can_switch_uid() else None
    read_fd = write_fd = -1
    proc: subprocess.Popen | None = None
    try:
        os.chmod(stage, 0o711)
        stage_in, stage_tests = os.path.join(stage, "in"), os.path.join(stage, "tests") if tests is not None else None
        os.makedirs(stage_in, mode=0o755)
        os.chmod(stage_in, 0o755)
        name = "sandbox" if uid is not None else "user"
        u, g = (uid, uid) if uid is not None else (os.getuid(), os.getgid())
        staged: dict[str, str | bytes] = {"etc/passwd": f"root:x:0:0::/:/bin/false\n{name}:x:{u}:{g}::/:/bin/false\n",
                                          "etc/group": f"root:x:0:\n{name}:x:{g}:\n"}
        staged.update(inputs or {})
        staged.update({f"files/{k}": v for k, v in (files or {}).items()})
        write_tree(stage_in, staged)
        if stage_tests is not None:
            os.makedirs(stage_tests, mode=0o755)
            write_tree(stage_tests, tests or {})
        if backend == "unsafe":
            layout = Layout(work=f"{stage}/work", tmp=f"{stage}/tmp", inputs=stage_in, tests=stage_tests or "")
            shutil.copytree(os.path.join(stage_in, "files"), layout.work, dirs_exist_ok=True) \
                if os.path.isdir(os.path.join(stage_in, "files")) else os.makedirs(layout.work)
            os.makedirs(layout.tmp)
            if uid is not None:
                _chown_tree(layout.work, uid)
                _chown_tree(layout.tmp, uid)
        else:
            layout = NS_LAYOUT
        if argv_fn is not None:
            argv = argv_fn(layout)
        if argv and "=" in argv[0]:
            raise ValueError(f"argv[0] {argv[0]!r} contains '=', which env(1) would read as a variable")
        pass_fds: tuple[int, ...] = ()
        if result_channel:
            read_fd, write_fd = os.pipe()
            pass_fds = (write_fd,)
            argv = [a.replace("{result_fd}", str(write_fd)) for a in argv]
        env = _base_env(cfg, layout, interp.path)
        if backend == "bwrap":
            cmd = bwrap_argv(cfg, interp, layout, stage_in, stage_tests, argv, env, uid)
        elif backend == "unshare":
            root_dir = os.path.join(stage, "root")
            os.makedirs(root_dir)
            cmd = unshare_argv(cfg, interp, layout, stage_in, stage_tests, root_dir, argv, env, uid)
        else:
            cmd = unsafe_argv(cfg, layout, argv, env, uid)
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                pass_fds=pass_fds, start_new_session=True, close_fds=True)
        if write_fd >= 0:
            os.close(write_fd)
            write_fd = -1
        assert proc.stdout is not None and proc.stderr is not None
        sinks = {proc.stdout.fileno(): _Sink(cfg.max_output_bytes), proc.stderr.fileno(): _Sink(cfg.max_output_bytes)}
        if read_fd >= 0:
            sinks[read_fd] = _Sink(cfg.max_result_bytes)
        timed_out = _pump(proc, sinks, cfg.timeout_s)
        _kill_group(proc)  # whatever is left of the launcher's group; the namespace died with its pid 1
        try:
            rc = proc.wait(timeout=KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            rc = None
        out, err = sinks[proc.stdout.fileno()], sinks[proc.stderr.fileno()]
        result_bytes = bytes(sinks[read_fd].data) if read_fd >= 0 else b""
        if rc is not None and rc < 0:
            rc = 128 - rc  # report signals the way bwrap and sh do
        died_by_signal = rc is not None and 128 < rc <= 128 + 64
        res = RunResult(stdout=out.data.decode("utf-8", "replace"), stderr=err.data.decode("utf-8", "replace"),
                        exit_code=rc, timed_out=timed_out, killed=timed_out or died_by_signal,
                        duration_s=round(time.monotonic() - t0, 4), isolation=backend, stdout_truncated=out.truncated,
                        stderr_truncated=err.truncated, uid=uid)
        return res, result_bytes, hash_tree(stage_tests) if stage_tests is not None else {}
    finally:
        if proc is not None:
            for f in (proc.stdout, proc.stderr):
                if f is not None:
                    f.close()
            if proc.poll() is None:
                _kill_group(proc)
        for fd in (read_fd, write_fd):
            if fd >= 0:
                os.close(fd)
        if uid is not None:
            sweep_uid(uid)
            release_uid(uid)
        shutil.rmtree(stage, ignore_errors=True)


def run_command(argv: list[str], files: dict[str, str | bytes] | None = None,
                cfg: SandboxConfig | None = None) -> RunResult:
    """Run `argv` in a fresh sandbox whose work dir (the cwd) holds `files`. Never raises for what the command does.

    Raises SandboxUnavailable when the configured backend cannot run here, or when only the limits-only backend
    is left and `cfg.allow_unsafe` is False.
    """
    cfg = cfg or SandboxConfig()
    res, _, _ = run_sandboxed(list(argv), files, cfg)
    return res
