"""Classes 4 and 5 of issue #11: resources outside the per-run accounting, and information about the host inside.
Each attack must end inside the run's limits with the host unchanged (host_guard checks it after each test)."""

import os
import sys
import textwrap

import pytest
from conftest import STAGING
from sbhelpers import MARK, needs_root

from posttrain.sandbox import grade_pytest, run_command
from posttrain.sandbox import cgroups, seccomp_filter

PY = sys.executable
needs_cgroup = pytest.mark.skipif(cgroups.probe() is not None, reason=f"no per-run cgroups here: {cgroups.probe()}")
needs_seccomp = pytest.mark.skipif(seccomp_filter.build()[0] is None,
                                   reason=f"no seccomp filter here: {seccomp_filter.build()[1]}")


def py(cfg, code, files=None, **overrides):
    return run_command([PY, "-c", textwrap.dedent(code)], files or {}, cfg.model_copy(update=overrides))


def numbers(stdout, key):
    return [int(line.split()[1]) for line in stdout.splitlines() if line.startswith(key + " ")]


# ---- class 4: resources outside the per-run accounting ---------------------------------------------------------

@needs_seccomp
def test_nested_user_namespace_and_tmpfs_refused(cfg):
    r = py(cfg, """
        import ctypes, subprocess
        libc = ctypes.CDLL(None, use_errno=True)
        for flags in (0x10000000, 0x10000000 | 0x20000, 0x20000, 0x40000000):  # NEWUSER, +NEWNS, NEWNS, NEWNET
            print("unshare", libc.unshare(flags), ctypes.get_errno())
        p = subprocess.run(["unshare", "-Urm", "sh", "-c", "mount -t tmpfs -o size=4g none /tmp && echo MOUNTED"],
                           capture_output=True, text=True)
        print(p.stdout, p.stderr)
    """)
    assert r.stdout.count("unshare -1 1") == 4 and "MOUNTED" not in r.stdout, r.stdout


@needs_cgroup
def test_memfd_past_the_memory_limit_is_charged_to_the_run(cfg):
    # RLIMIT_FSIZE caps each memfd at max_file_mb, so the attack spreads over many; RLIMIT_AS never sees them.
    r = py(cfg, """
        import os
        total = 0
        fds = []
        try:
            for i in range(60):
                fd = os.memfd_create(f"m{i}"); fds.append(fd)
                for _ in range(15):
                    os.write(fd, b"x" * (1 << 20)); total += 1
                print("mb", total, flush=True)
        except OSError as e:
            print("stopped", e.errno, flush=True)
    """, run_memory_mb=160, memory_mb=256, max_file_mb=16, timeout_s=10.0)
    written = max(numbers(r.stdout, "mb") or [0])
    assert written <= 160 and (r.oom_killed or "stopped" in r.stdout), (written, r)


@needs_cgroup
def test_dev_shm_and_tmpfs_fill_are_charged_to_the_run(cfg):
    r = py(cfg, """
        import os
        total = 0
        for d in ("/dev/shm", "/tmp", "."):
            try:
                with open(os.path.join(d, "fill"), "wb") as f:
                    for _ in range(400):
                        f.write(b"x" * (1 << 20)); f.flush(); total += 1
            except OSError as e:
                print("stopped", d, e.errno, flush=True)
            print("mb", total, flush=True)
    """, run_memory_mb=160, tmpfs_mb=2048, max_file_mb=512, timeout_s=10.0)
    # The tmpfs would take 2 GB: only the run's cgroup stops it.
    assert max(numbers(r.stdout, "mb") or [0]) <= 160 and (r.oom_killed or "stopped" in r.stdout), r.stdout


def test_inode_flood_stops_at_the_cap(cfg):
    r = py(cfg, """
        import os
        n = 0
        os.makedirs("d", exist_ok=True)
        try:
            while n < 200000:
                open(f"d/{n}", "w").close(); n += 1
        except OSError as e:
            print("stopped", e.errno)
        print("files", n)
    """, max_inodes=2000, timeout_s=20.0)
    if "inode_cap" in r.unavailable:
        pytest.skip(f"no inode cap here: {r.unavailable['inode_cap']}")
    assert 0 < numbers(r.stdout, "files")[0] <= 2000 and "stopped 28" in r.stdout, r.stdout


@needs_seccomp
def test_keyring_keys_neither_made_nor_seen_across_runs(cfg):
    make = py(cfg, """
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        for ring in (-4, -5, -3):  # user, user-session, session keyring
            k = libc.syscall(248, b"user", b"ptsb-key", b"s3cret", 6, ring)
            print("add_key", k, ctypes.get_errno())
            if k > 0:
                libc.syscall(250, 5, k, 0x3f3f3f3f)  # KEYCTL_SETPERM: everyone may read
    """)
    assert make.stdout.count("add_key -1 1") == 3, make.stdout
    read = py(cfg, """
        print(open("/proc/keys").read() if __import__("os").path.exists("/proc/keys") else "")
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        print("search", libc.syscall(250, 10, -4, b"user", b"ptsb-key", 0), ctypes.get_errno())
    """)
    assert "ptsb-key" not in read.stdout and "s3cret" not in read.stdout


@needs_seccomp
@pytest.mark.parametrize("family", [40, 38, 17, 15, 44, 200], ids=["vsock", "alg", "packet", "key", "xdp", "bogus"])
def test_socket_families_outside_the_list_refused(cfg, family):
    r = py(cfg, f"""
        import socket
        for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.SOCK_RAW, socket.SOCK_SEQPACKET):
            try:
                socket.socket({family}, kind); print("OPEN")
            except OSError as e:
                print("refused", e.errno)
    """)
    assert "OPEN" not in r.stdout and r.stdout.count("refused 97") == 4, r.stdout


@needs_seccomp
def test_other_kernel_surface_refused(cfg):
    r = py(cfg, """
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        buf = ctypes.create_string_buffer(256)
        for name, nr, args in [("io_uring_setup", 425, (8, buf)), ("bpf", 321, (0, buf, 64)),
                               ("userfaultfd", 323, (0,)), ("perf_event_open", 298, (buf, 0, -1, -1, 0)),
                               ("ptrace", 101, (16, 1, 0, 0)), ("setns", 308, (0, 0))]:
            print(name, libc.syscall(nr, *args), ctypes.get_errno())
    """)
    assert r.stdout.count(" -1 1\n") == 6, r.stdout


def test_result_reports_every_defence(cfg):
    r = py(cfg, "pass")
    # On these machines (root, bwrap or unshare, cgroup v1, libseccomp) nothing is missing; elsewhere the
    # reasons are listed, never silently dropped.
    missing = {k for k in ("seccomp", "cgroup", "inode_cap", "private_staging") if k in r.unavailable}
    expected = set()
    if seccomp_filter.build()[0] is None:
        expected.add("seccomp")
    if cgroups.probe() is not None:
        expected.add("cgroup")
    assert missing >= expected and all(r.unavailable[k] for k in missing)


# ---- class 5: information that should not be inside ------------------------------------------------------------

SNOOP = textwrap.dedent("""
    import glob, os
    seen = []
    for p in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            print("CMDLINE", open(p, "rb").read().decode("latin-1").replace("\\0", " "))
        except OSError:
            pass
    for p in glob.glob("/proc/[0-9]*/environ") + ["/proc/self/mountinfo",
              "/proc/1/mountinfo", "/proc/self/cgroup"]:
        try:
            seen.append(open(p, "rb").read().decode("latin-1"))
        except OSError:
            pass
    for fd in os.listdir("/proc/self/fd"):
        try:
            seen.append(os.readlink(f"/proc/self/fd/{fd}"))
            seen.append(open(f"/proc/self/fd/{fd}", "rb").read(1 << 16).decode("latin-1"))
        except OSError:
            pass
    for d in ("/in", "/"):
        seen.append(" ".join(os.listdir(d)))
    print("\\n".join(seen).replace("\\0", " "))
""")


def _leaks(text):
    """Host paths that must not show inside: the staging area, and this checkout, except where the checkout holds
    the interpreter (a venv in it, as in CI): the interpreter's own prefix is bound at its host path by design
    (venvs hard-code it; docs/sandbox.md, known limits), so its path may appear, nothing else of the checkout."""
    from posttrain.sandbox.backends import probe_interpreter

    roots = probe_interpreter(sys.executable).roots
    for r in sorted(roots, key=len, reverse=True):
        text = text.replace(r, "<interpreter>")
    return [s for s in (STAGING, "posttrain-sb-", "ptsb-tests-", os.getcwd()) if s in text]


def cmdlines(stdout):
    return "\n".join(line for line in stdout.splitlines() if line.startswith("CMDLINE "))


def test_no_host_paths_or_env_values_in_proc(cfg):
    r = py(cfg, SNOOP)
    if "private_staging" in r.unavailable:
        pytest.skip(f"staging dir cannot be a private tmpfs here: {r.unavailable['private_staging']}")
    assert "CMDLINE" in r.stdout and not _leaks(r.stdout), _leaks(r.stdout)
    assert "prlimit" not in cmdlines(r.stdout) and "--ro-bind" not in cmdlines(r.stdout)  # the launch is not on view


def test_env_values_not_on_any_command_line(cfg):
    r = py(cfg, SNOOP, env={"PTSB_ENVVAL": f"envval-{MARK}"})
    assert "CMDLINE" in r.stdout and f"envval-{MARK}" not in cmdlines(r.stdout), cmdlines(r.stdout)


@needs_root
def test_solution_process_sees_no_host_paths_in_two_process_grading(cfg):
    sol = SNOOP + "def add(a, b):\n    return a + b\n"
    tests = {"test_add.py": "from sol import add\n\ndef test_a():\n    assert add(1, 2) == 3\n"}
    g = grade_pytest({"sol.py": sol}, tests, cfg.model_copy(update={"env": {"PTSB_ENVVAL": f"envval-{MARK}"}}))
    assert g.score == 1.0 and g.trust == "out-of-process"
    assert "CMDLINE" in g.run.stdout and not _leaks(g.run.stdout), _leaks(g.run.stdout)
    assert f"envval-{MARK}" not in cmdlines(g.run.stdout)


def test_docs_list_every_refused_syscall():
    docs = (__import__("pathlib").Path(__file__).parents[2] / "docs" / "sandbox.md").read_text()
    assert [name for name, _ in seccomp_filter.DENIED if f"| `{name}` |" not in docs] == []
