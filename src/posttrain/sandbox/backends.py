"""Backends: which isolation this machine supports, and the host argv that starts a command under each.

Best first: bubblewrap (`bwrap`), util-linux `unshare` plus a chroot we build ourselves, and a limits-only
fallback that hides nothing and so runs only when the caller opts in with `allow_unsafe=True`.
"""

from __future__ import annotations

import functools
import json
import os
import shlex
import shutil
import subprocess
from dataclasses import dataclass

from posttrain.sandbox.config import SandboxConfig
from posttrain.sandbox.limits import can_switch_uid
from posttrain.sandbox.tools import SandboxUnavailable, tool

BACKENDS = ("bwrap", "unshare", "unsafe")
# Paths inside a namespaced sandbox. The work dir is a fresh tmpfs; /tmp points into it so its size limit covers both.
BOX = "/sandbox"
PROBE_TIMEOUT_S = 20.0


@dataclass
class Layout:
    """Where things are, as the sandboxed command sees them."""

    work: str  # cwd and HOME, writable, fresh per run
    tmp: str  # TMPDIR
    inputs: str  # read-only: the staged files, harness scripts, case inputs
    tests: str  # read-only: pristine test files (grade_pytest)
    runner: str = ""  # two-process runs: the test process's private home
    rpc: str = ""  # two-process runs: root-only dir of the FIFOs between the processes


NS_LAYOUT = Layout(
    work=f"{BOX}/work", tmp=f"{BOX}/tmp", inputs="/in", tests="/tests", runner=f"{BOX}/runner", rpc=f"{BOX}/rpc"
)
LAUNCH = ".launch.sh"  # the root-only launch script, staged in the inputs dir


@dataclass
class Interpreter:
    """Facts about the configured Python, found by running it once outside the sandbox (it is trusted)."""

    path: str
    roots: list[str]  # directories to bind read-only so it runs inside
    version: tuple[int, int]
    has_pytest: bool


@functools.lru_cache(maxsize=8)
def probe_interpreter(python: str) -> Interpreter:
    """Ask `python` where its prefixes are; those (outside the system dirs we always bind) get bound read-only."""
    code = (
        "import sys, os, json, importlib.util as u; print(json.dumps([sys.prefix, sys.base_prefix, sys.exec_prefix,"
        " sys.base_exec_prefix, os.path.realpath(sys.executable), list(sys.version_info[:2]),"
        " u.find_spec('pytest') is not None]))"
    )
    try:
        out = subprocess.run(
            [python, "-I", "-c", code], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise SandboxUnavailable(f"cannot run the sandbox interpreter {python!r}: {e}") from None
    prefix, base, exec_prefix, base_exec, real_exe, version, has_pytest = json.loads(out)
    candidates = {
        prefix,
        base,
        exec_prefix,
        base_exec,
        os.path.dirname(real_exe),
        os.path.dirname(os.path.abspath(python)),
    }
    roots = _outermost(p for p in candidates if not _under_system_dirs(p))
    return Interpreter(
        path=os.path.abspath(python), roots=roots, version=(version[0], version[1]), has_pytest=bool(has_pytest)
    )


def _under_system_dirs(path: str) -> bool:
    real = os.path.realpath(path)
    return any(real == d or real.startswith(d + "/") for d in ("/usr", "/bin", "/lib", "/lib64", "/sbin"))


def _outermost(paths) -> list[str]:
    """Drop paths nested in other paths, so each tree is bound once."""
    kept: list[str] = []
    for p in sorted({os.path.abspath(p) for p in paths}, key=len):
        if not any(p == k or p.startswith(k + "/") for k in kept):
            kept.append(p)
    return kept


def roots_under_tmp(interp: Interpreter) -> list[str]:
    """The interpreter's roots that lie under /tmp: any makes /tmp a tmpfs of its own with the interpreter bound
    inside it (both argv builders here; run.py's private mounts ask the same)."""
    return [r for r in interp.roots if r == "/tmp" or r.startswith("/tmp/")]


def system_binds() -> list[tuple[str, str]]:
    """(kind, path) for the read-only system tree: a merged-/usr symlink stays a symlink, a real dir is bound."""
    out = [("bind", "/usr")]
    for d in ("/bin", "/lib", "/lib64", "/lib32", "/sbin"):
        if os.path.islink(d):
            out.append(("symlink", d))
        elif os.path.isdir(d):
            out.append(("bind", d))
    return out


def bwrap_argv(
    cfg: SandboxConfig,
    interp: Interpreter,
    layout: Layout,
    stage_in: str,
    stage_tests: str | None,
    box_dir: str | None,
    uid_namespace: bool,
    seccomp_fd: int | None,
) -> list[str]:
    """bubblewrap: new mount/pid/net/ipc/uts/cgroup namespaces, only system dirs and the interpreter visible.

    As root we keep bwrap out of a user namespace and drop to the run's own uid with setpriv instead: inside a
    user namespace the process would still be host uid 0, and RLIMIT_NPROC would count all of root's processes.
    `box_dir` is a host tmpfs with an inode cap to bind as the box (None: bwrap makes a plain tmpfs). The
    result is meant for `bwrap --args FD`: it names host paths, and bwrap's own command line is readable inside.
    """
    cmd = [
        "--unshare-ipc",
        "--unshare-pid",
        "--unshare-net",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--die-with-parent",
        "--new-session",
        "--clearenv",
        "--hostname",
        "sandbox",
    ]
    if uid_namespace:
        cmd.append("--unshare-user")
    if seccomp_fd is not None:
        cmd += ["--seccomp", str(seccomp_fd)]
    for kind, path in system_binds():
        cmd += ["--ro-bind", path, path] if kind == "bind" else ["--symlink", os.readlink(path), path]
    made: set[str] = {"/"}
    tmp_roots = roots_under_tmp(interp)
    if tmp_roots:
        # The interpreter lives under /tmp (a venv in a checkout there): /tmp cannot be the usual symlink into the
        # work dir, so it becomes a fresh size-limited tmpfs of its own, with the interpreter bound inside it.
        # Each of the two tmpfs gets half of tmpfs_mb, so the run's total stays within it.
        cmd += ["--size", str(cfg.tmpfs_mb << 19), "--perms", "1777", "--tmpfs", "/tmp"]
        made.add("/tmp")
    for root in interp.roots:
        # bwrap 0.8 creates missing parents 0700, which the run's uid could not traverse.
        parts = root.strip("/").split("/")
        for i in range(1, len(parts)):
            parent = "/" + "/".join(parts[:i])
            if parent not in made:
                cmd += ["--perms", "0755", "--dir", parent]
                made.add(parent)
        cmd += ["--ro-bind", root, root]
    cmd += ["--proc", "/proc", "--dev", "/dev"]
    if box_dir is not None:
        cmd += ["--bind", box_dir, BOX]
    else:
        cmd += ["--size", str(cfg.tmpfs_mb << (19 if tmp_roots else 20)), "--perms", "0755", "--tmpfs", BOX]
    if not tmp_roots:
        cmd += ["--symlink", layout.tmp, "/tmp"]
    cmd += ["--ro-bind", stage_in, layout.inputs]
    if stage_tests is not None:
        cmd += ["--ro-bind", stage_tests, layout.tests]
    cmd += [
        "--perms",
        "0755",
        "--dir",
        "/etc",
        "--ro-bind",
        f"{stage_in}/etc/passwd",
        "/etc/passwd",
        "--ro-bind",
        f"{stage_in}/etc/group",
        "/etc/group",
        "--remount-ro",
        "/",
        "--chdir",
        "/",
    ]
    return cmd  # the command itself (bwrap_command) goes on the real command line: --args takes options only


def bwrap_command(layout: Layout) -> list[str]:
    return ["--", "/bin/sh", "-e", f"{layout.inputs}/{LAUNCH}"]


def unshare_argv(
    cfg: SandboxConfig,
    interp: Interpreter,
    layout: Layout,
    stage_in: str,
    stage_tests: str | None,
    root_dir: str,
    uid_namespace: bool,
) -> tuple[list[str], str]:
    """util-linux unshare: the same namespaces, plus a root we assemble on a tmpfs and chroot into. Returns
    (argv, the mount script to feed on stdin).

    The mount script (it names host paths) is fed on stdin, not a command line. A root shell stays as
    pid 1 (inside the chroot) and waits: the launch chain changes uid, which clears the parent-death signal,
    so pid 1 must be a process that keeps it. When pid 1 exits, the kernel kills the whole namespace.
    """
    q = shlex.quote
    r = root_dir
    inodes = cfg.max_inodes
    lines = ["set -e", f"mount -t tmpfs -o size=1m,nr_inodes=256,mode=755 ptsb-root {q(r)}"]
    tmp_roots = roots_under_tmp(interp)
    if tmp_roots:  # see bwrap_argv: /tmp becomes its own tmpfs holding the interpreter
        lines.append(
            f"mkdir -p {q(r)}/tmp && mount -t tmpfs -o size={cfg.tmpfs_mb << 9}k,nr_inodes={inodes},"
            f"mode=1777,nosuid,nodev ptsb-tmp {q(r)}/tmp"
        )
    ro_dirs = [p for kind, p in system_binds() if kind == "bind"] + interp.roots
    for d in ro_dirs:
        lines.append(f"mkdir -p {q(r + d)} && mount --rbind {q(d)} {q(r + d)} && mount -o remount,bind,ro {q(r + d)}")
    for kind, p in system_binds():
        if kind == "symlink":
            lines.append(f"ln -s {q(os.readlink(p))} {q(r + p)}")
    lines += [
        f"mkdir -p {q(r)}/proc {q(r)}/dev {q(r + BOX)} {q(r + layout.inputs)} {q(r)}/etc",
        f"mount -t proc -o nosuid,nodev,noexec proc {q(r)}/proc",
        f"mount -t tmpfs -o size={cfg.tmpfs_mb << (9 if tmp_roots else 10)}k,nr_inodes={inodes},mode=755,"
        f"nosuid,nodev ptsb-work {q(r + BOX)}",
        f"mount --bind {q(stage_in)} {q(r + layout.inputs)} && mount -o remount,bind,ro {q(r + layout.inputs)}",
    ]
    if not tmp_roots:
        lines.append(f"ln -s {q(layout.tmp)} {q(r)}/tmp")
    for dev in ("null", "zero", "full", "random", "urandom"):
        lines.append(f"touch {q(r)}/dev/{dev} && mount --bind /dev/{dev} {q(r)}/dev/{dev}")
    for f in ("passwd", "group"):
        lines.append(f"touch {q(r)}/etc/{f} && mount --bind {q(stage_in)}/etc/{f} {q(r)}/etc/{f}")
    if stage_tests is not None:
        lines.append(
            f"mkdir -p {q(r + layout.tests)} && mount --bind {q(stage_tests)} {q(r + layout.tests)}"
            f" && mount -o remount,bind,ro {q(r + layout.tests)}"
        )
    lines.append(f"mount -o remount,ro {q(r)}")
    # pid 1 enters the chroot too, so its /proc/1/mountinfo and root show no host paths; it stays root and keeps
    # the parent-death signal (chroot(1) is no setuid exec), waiting for the launch script's process.
    inner = f"/bin/sh -e {q(layout.inputs + '/' + LAUNCH)} </dev/null & wait $!"
    lines.append(f"exec chroot {q(r)} /bin/sh -c {q(inner)} </dev/null")
    cmd = [
        tool("setpriv"),
        "--pdeathsig=KILL",
        "--",
        tool("unshare"),
        "--mount",
        "--uts",
        "--ipc",
        "--net",
        "--pid",
        "--cgroup",
        "--fork",
        "--kill-child",
        "--propagation",
        "private",
    ]
    if uid_namespace:
        cmd += ["--user", "--map-root-user"]
    return cmd + ["--", "/bin/sh", "-s"], "\n".join(lines) + "\n"


def _probe(cmd: list[str]) -> str | None:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError) as e:
        return f"{cmd[0]} failed to start: {e}"
    if p.returncode != 0:
        return f"{os.path.basename(cmd[0])} exited {p.returncode}: {(p.stderr or p.stdout).strip()[:300]}"
    return None


@functools.lru_cache(maxsize=1)
def probe_backends() -> dict[str, str | None]:
    """For each backend: None when it works here, else the reason it does not. Cached per process."""
    reasons: dict[str, str | None] = {}
    if shutil.which("bwrap") is None:
        reasons["bwrap"] = "bwrap not installed (Debian/Ubuntu: apt-get install bubblewrap; `make setup` tries it)"
    else:
        flags = [
            "--unshare-ipc",
            "--unshare-pid",
            "--unshare-net",
            "--unshare-uts",
            "--die-with-parent",
            "--new-session",
            "--clearenv",
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--tmpfs",
            "/tmp",
        ]
        if not can_switch_uid():
            flags.append("--unshare-user")
        binds = [
            a
            for kind, p in system_binds()
            for a in (["--ro-bind", p, p] if kind == "bind" else ["--symlink", os.readlink(p), p])
        ]
        reasons["bwrap"] = _probe([shutil.which("bwrap") or "bwrap", *flags, *binds, "--", "/bin/true"])
    if shutil.which("unshare") is None:
        reasons["unshare"] = "unshare (util-linux) not installed"
    else:
        extra = [] if can_switch_uid() else ["--user", "--map-root-user"]
        reasons["unshare"] = _probe(
            [
                shutil.which("unshare") or "unshare",
                "--mount",
                "--net",
                "--pid",
                "--fork",
                "--ipc",
                "--uts",
                "--propagation",
                "private",
                *extra,
                "--",
                "/bin/sh",
                "-c",
                "mount -t tmpfs none /mnt && mount -t proc proc /proc",
            ]
        )
    reasons["unsafe"] = None
    return reasons


def detect_backend() -> str:
    """The backend `backend="auto"` resolves to on this machine ("bwrap", "unshare" or "unsafe").

    `probe_backends()` says why each better backend was not chosen (for `posttrain env check`).
    """
    reasons = probe_backends()
    return next(b for b in BACKENDS if reasons[b] is None)


def resolve_backend(cfg: SandboxConfig) -> str:
    """The backend a run with `cfg` uses; raises SandboxUnavailable with the reasons when there is none."""
    reasons = probe_backends()
    name = detect_backend() if cfg.backend == "auto" else cfg.backend
    if reasons.get(name) is not None:
        raise SandboxUnavailable(f"sandbox backend {name!r} is unavailable: {reasons[name]}")
    if name == "unsafe" and not cfg.allow_unsafe:
        why = "; ".join(f"{b}: {reasons[b]}" for b in ("bwrap", "unshare") if reasons[b])
        raise SandboxUnavailable(
            "refusing the 'unsafe' backend (limits only; host files and network are visible)"
            f" without allow_unsafe=True. {why}"
        )
    return name
