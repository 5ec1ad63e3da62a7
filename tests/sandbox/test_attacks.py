"""Attacks on the sandbox and on grading. Each must be contained, score 0, and leave the host unchanged
(the autouse `host_guard` in conftest.py checks the host after every test). Runs per isolating backend."""

import json
import os
import socket
import sys
import textwrap
import threading

import pytest
from sbhelpers import MARK, needs_root

from posttrain.sandbox import SandboxConfig, SandboxUnavailable, grade_function, grade_pytest, run_command

PY = sys.executable


def py(cfg, code, files=None, **overrides):
    """Run Python source in the sandbox."""
    return run_command([PY, "-c", textwrap.dedent(code)], files or {}, cfg.model_copy(update=overrides))


ADD_CASES = [{"args": [i, 2], "expected": i + 2} for i in range(4)]
ADD_TESTS = {"test_add.py": "from sol import add\n\ndef test_a():\n    assert add(1, 2) == 3\n\n"
                            "def test_b():\n    assert add(2, 2) == 4\n"}


def fn_score(cfg, body, cases=ADD_CASES):
    return grade_function(textwrap.dedent(body), "add", cases, cfg)


# ---- resource exhaustion -------------------------------------------------------------------------------------

def test_infinite_loop(cfg):
    r = py(cfg, "while True: pass", timeout_s=1.0)
    assert r.timed_out and r.killed and r.duration_s < 4
    g = fn_score(cfg.model_copy(update={"timeout_s": 2.0, "case_timeout_s": 1.0}), "def add(a, b):\n    while True: pass\n")
    assert g.score == 0 and g.total == 4


def test_sleep_past_timeout(cfg):
    r = py(cfg, "import time; time.sleep(60)", timeout_s=1.0)
    assert r.timed_out and r.duration_s < 4


def test_ignores_sigterm(cfg):
    r = py(cfg, "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True: time.sleep(0.01)",
           timeout_s=1.0)
    assert r.timed_out and r.killed


def test_bounded_fork_loop(cfg):
    r = py(cfg, """
        import os, time
        n = 0
        for _ in range(500):
            try:
                if os.fork() == 0:
                    time.sleep(30); os._exit(0)
                n += 1
            except OSError:
                break
        print(n, flush=True)
        time.sleep(30)
    """, timeout_s=1.5)
    assert r.timed_out
    assert 0 < int(r.stdout.split()[0]) < cfg.max_procs


def test_ten_thousand_threads(cfg):
    r = py(cfg, """
        import threading, time
        ev = threading.Event(); n = 0
        try:
            for _ in range(10000):
                threading.Thread(target=ev.wait, daemon=True).start(); n += 1
        except Exception as e:
            print("stopped", type(e).__name__)
        print(n); ev.set()
    """)
    assert "stopped" in r.stdout and int(r.stdout.split()[-1]) < cfg.max_procs


def test_ten_gb_allocation(cfg):
    r = py(cfg, "b = bytearray(10 * 2**30)\nprint('allocated')")
    assert "allocated" not in r.stdout and "MemoryError" in r.stderr


def test_fill_the_disk(cfg):
    r = py(cfg, """
        import os
        total = 0
        for i in range(100):
            for path in (f"fill{i}", f"/tmp/fill{i}"):
                try:
                    with open(path, "wb") as f:
                        for _ in range(64):
                            f.write(b"x" * (1 << 20)); f.flush(); total += 1 << 20
                except OSError as e:
                    last = e.errno
        print(total, last)
    """)
    total, errno = map(int, r.stdout.split())
    assert total <= cfg.tmpfs_mb << 20 and errno in (27, 28)  # EFBIG (RLIMIT_FSIZE) or ENOSPC (tmpfs size)


def test_infinite_printing(cfg):
    r = py(cfg, "while True: print('x' * 1000)", timeout_s=1.0)
    assert r.timed_out and r.stdout_truncated and len(r.stdout.encode()) <= cfg.max_output_bytes


# ---- network -------------------------------------------------------------------------------------------------

def test_no_outside_network_or_dns(cfg):
    r = py(cfg, """
        import socket
        for what, f in [("tcp", lambda: socket.create_connection(("1.1.1.1", 53), timeout=1)),
                        ("dns", lambda: socket.getaddrinfo("example.com", 80))]:
            try:
                f(); print(what, "OPEN")
            except OSError as e:
                print(what, "blocked", type(e).__name__)
    """)
    assert r.stdout.count("blocked") == 2 and "OPEN" not in r.stdout


def _serve(sock, hits):
    def loop():
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            hits.append(1)
            conn.close()
    t = threading.Thread(target=loop, daemon=True)
    t.start()
    return t


def test_host_loopback_server_unreachable(cfg):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    hits = []
    _serve(srv, hits)
    port = srv.getsockname()[1]
    try:
        r = py(cfg, f"""
            import socket
            try:
                socket.create_connection(("127.0.0.1", {port}), timeout=1); print("CONNECTED")
            except OSError as e:
                print("blocked", type(e).__name__)
        """)
    finally:
        srv.shutdown(socket.SHUT_RDWR)
        srv.close()
    assert "blocked" in r.stdout and not hits


def test_host_unix_socket_unreachable(cfg, tmp_path):
    path = str(tmp_path / "host.sock")
    abstract = f"{MARK}-{os.urandom(4).hex()}"
    hits = []
    servers = []
    for addr in (path, f"\0{abstract}"):
        s = socket.socket(socket.AF_UNIX)
        s.bind(addr)
        s.listen()
        _serve(s, hits)
        servers.append(s)
    try:
        r = py(cfg, f"""
            import socket
            for addr in ({path!r}, "\\0{abstract}"):
                s = socket.socket(socket.AF_UNIX)
                try:
                    s.connect(addr); print("CONNECTED")
                except OSError as e:
                    print("blocked", type(e).__name__)
        """)
    finally:
        for s in servers:
            s.shutdown(socket.SHUT_RDWR)
            s.close()
    assert r.stdout.count("blocked") == 2 and not hits


# ---- reading host secrets ------------------------------------------------------------------------------------

def test_cannot_read_host_files_ssh_or_host_proc(cfg, host_guard):
    secret = host_guard["secret"]
    r = py(cfg, f"""
        import os
        for p in [{str(secret)!r}, os.path.expanduser("~/.ssh"), "/root/.ssh", "/root/.ssh/id_rsa", "/etc/shadow",
                  "/proc/{os.getpid()}/cmdline", "/proc/1/environ"]:
            try:
                data = open(p, "rb").read() if not p.endswith("ssh") else str(os.listdir(p)).encode()
                print("READ", data[:200])
            except OSError as e:
                print(p, "denied", type(e).__name__)
        print("pids", sorted(int(x) for x in os.listdir("/proc") if x.isdigit()))
    """)
    assert "TOPSECRET" not in r.stdout and "READ" not in r.stdout, r.stdout
    assert r.stdout.count("denied") == 7, r.stdout
    pids = json.loads(r.stdout.split("pids", 1)[1])
    assert len(pids) < 5  # a fresh pid namespace: none of the host's processes is visible


def test_cannot_read_secret_env(cfg, monkeypatch):
    monkeypatch.setenv("PTSB_SECRET_TOKEN", f"hunter2-{MARK}")
    r = py(cfg, "import os; print(dict(os.environ))")
    assert "hunter2" not in r.stdout and "PTSB_SECRET_TOKEN" not in r.stdout


def test_git_history_of_task_dir_invisible(cfg, tmp_path):
    task = tmp_path / "task"
    (task / ".git" / "refs").mkdir(parents=True)
    (task / ".git" / "ANSWER").write_text("the answer is 424242")
    (task / "solution.py").write_text("def add(a, b):\n    return 0\n")
    code = f"""
        import os
        def find():
            for root in ["/", "/sandbox", {str(task)!r}, os.getcwd()]:
                for dirpath, dirs, files in os.walk(root):
                    dirs[:] = [d for d in dirs if d not in ("proc", "usr", "sys", "dev")]
                    if "ANSWER" in files:
                        return open(os.path.join(dirpath, "ANSWER")).read()
            return ""
        def add(a, b):
            return 424242 if "424242" in find() else -1
    """
    files = {p.name: p.read_text() for p in task.iterdir() if p.is_file()}
    g = fn_score(cfg, code)
    assert g.score == 0
    r = py(cfg, "import os; print(sorted(os.listdir('.')))", files=files)
    assert ".git" not in r.stdout and "solution.py" in r.stdout


# ---- writing and killing on the host -------------------------------------------------------------------------

def test_cannot_write_etc_usr_or_tests(cfg):
    here = os.path.abspath(__file__)
    r = py(cfg, f"""
        import os
        for p in ["/etc/pwn-{MARK}", "/usr/pwn-{MARK}", "/usr/bin/pwn-{MARK}", {here!r}, "/in/pwn", "/pwn-{MARK}"]:
            try:
                open(p, "a").write("x"); print(p, "WROTE")
            except OSError as e:
                print(p, "denied", type(e).__name__)
    """)
    assert "WROTE" not in r.stdout and r.stdout.count("denied") == 6
    with open(here) as f:
        assert "pwn" not in f.read()[-50:]


def test_kill_parent_and_kill_all(cfg, host_guard):
    r = py(cfg, """
        import os, signal
        for target in (os.getppid(), 1):
            try:
                os.kill(target, signal.SIGKILL); print("killed", target)
            except OSError as e:
                print("denied", type(e).__name__)
        os.kill(-1, signal.SIGKILL)
    """)
    assert "killed" not in r.stdout
    assert host_guard["sentinel"].poll() is None


def test_setsid_double_fork_daemon(cfg):
    r = py(cfg, f"""
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.execv({PY!r}, [{PY!r}, "-c", "import time; time.sleep(60)", "{MARK}"])
            os._exit(0)
        time.sleep(0.3)
        print("parent done")
    """)
    assert "parent done" in r.stdout and not r.timed_out  # the daemon did not keep the run alive either


def test_cache_does_not_survive_between_runs(cfg):
    write = "import os\nfor p in ('cache.txt', '/tmp/cache.txt', os.path.expanduser('~/.cache_x')):\n" \
            "    open(p, 'w').write('cached')\nprint('wrote')"
    read = ("import os\nprint([os.path.exists(p) for p in\n"
            "       ('cache.txt', '/tmp/cache.txt', os.path.expanduser('~/.cache_x'))])")
    assert "wrote" in py(cfg, write).stdout
    assert py(cfg, read).stdout.strip() == "[False, False, False]"


# ---- forging the grade: grade_function --------------------------------------------------------------------------

@pytest.mark.parametrize("body", [
    "import sys\nsys.exit(0)\ndef add(a, b): return a + b",
    "raise SystemExit(0)\ndef add(a, b): return a + b",
    "import os\nos._exit(0)\ndef add(a, b): return a + b",
    "import sys\ndef add(a, b): sys.exit(0)",
    "import os\ndef add(a, b): os._exit(0)",
], ids=["sys.exit", "SystemExit", "os._exit", "exit-in-call", "os._exit-in-call"])
def test_exit_before_checks_scores_zero(cfg, body):
    g = fn_score(cfg, body)
    assert g.score == 0 and g.passed == 0


def test_always_equal_and_str_subclass(cfg):
    g = fn_score(cfg, """
        class Eq:
            def __eq__(self, o): return True
            def __ne__(self, o): return False
        class S(str):
            def __eq__(self, o): return True
            __hash__ = str.__hash__
        class I(int):
            def __eq__(self, o): return True
            __hash__ = int.__hash__
        def add(a, b):
            return [Eq(), S("x"), I(0), {"k": Eq()}][a % 4]
    """)
    assert g.score == 0


def test_forging_via_getframe_and_gc(cfg):
    g = fn_score(cfg, """
        import gc, sys, io
        def add(a, b):
            f = sys._getframe(1)
            while f is not None:          # look for expected values up the stack: there are none inside
                for k, v in list(f.f_locals.items()):
                    if k in ("expected", "cases") or "expected" in str(v)[:10000]:
                        return "FOUND"
                f = f.f_back
            for o in gc.get_objects():     # write forged lines straight into the result channel
                if isinstance(o, io.TextIOWrapper) and o.writable() and o.fileno() > 2:
                    for i in range(4):
                        o.write('{"i": %d, "v": "PASSED"}\\n' % i)
                    o.flush()
            return -1
    """)
    assert g.score == 0


def test_printing_passed_or_fake_junit(cfg):
    junit = '<testsuite tests="4" failures="0"><testcase name="t"/></testsuite>'
    body = f"""
        print("PASSED"); print("1.0"); print({junit!r})
        open("junit.xml", "w").write({junit!r}); open("/tmp/report.xml", "w").write({junit!r})
        def add(a, b):
            print("PASSED 1.0")
            return None
    """
    assert fn_score(cfg, body).score == 0
    files = {"sol.py": textwrap.dedent(body)}
    assert grade_pytest(files, ADD_TESTS, cfg).score == 0


def test_git_answer_not_in_sandbox_and_cases_mutation(cfg):
    # A solution that mutates its inputs cannot change later cases: each case is re-parsed from JSON.
    cases = [{"args": [[1, 2]], "expected": 3}, {"args": [[1, 2]], "expected": 3}]
    g = grade_function("def add(xs):\n    s = sum(xs)\n    xs.append(100)\n    return s\n", "add", cases, cfg)
    assert g.score == 1.0


# ---- forging the grade: grade_pytest ----------------------------------------------------------------------------

WRONG = "def add(a, b):\n    return 0\n"
# If this ran before pytest started (as an honoured sitecustomize would), every test would report passed.
PATCH_PYTEST = "import _pytest.reports\n_pytest.reports.BaseReport.passed = property(lambda self: True)\n"


@pytest.mark.parametrize("extra", [
    {"conftest.py": "import pytest\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
                    "    out = yield\n    r = out.get_result()\n    r.outcome = 'passed'\n"},
    {"sitecustomize.py": PATCH_PYTEST, "usercustomize.py": PATCH_PYTEST},
    {"evil.pth": "import _pytest.reports; _pytest.reports.BaseReport.passed = property(lambda self: True)\n"},
    {"pytest.ini": "[pytest]\naddopts = --collect-only\n",
     "pyproject.toml": "[tool.pytest.ini_options]\naddopts='-k nothing'\n"},
    {"evil-1.0.dist-info/METADATA": "Name: evil\nVersion: 1.0\n", "evil-1.0.dist-info/entry_points.txt":
        "[pytest11]\nevil = evilplug\n",
     "evilplug.py": "def pytest_collection_modifyitems(items):\n    items.clear()\n"},
], ids=["conftest", "sitecustomize", "pth", "ini-files", "entry-point-plugin"])
def test_dropped_config_files_are_ignored(cfg, extra):
    g = grade_pytest({"sol.py": WRONG, **extra}, ADD_TESTS, cfg)
    assert g.score == 0 and g.total == 2


@pytest.mark.parametrize("sol", [
    "import unittest\nraise unittest.SkipTest('no')\n",
    "import pytest\npytest.skip('no', allow_module_level=True)\n",
    "import pytest\ndef add(a, b):\n    pytest.skip('no')\n",
    "import sys\nsys.exit(0)\n",
    "import os\nos._exit(0)\n",
    "def add(a, b)\n    return a + b\n",
], ids=["SkipTest", "module-skip", "skip-in-test", "sys.exit", "os._exit", "syntax-error"])
def test_skip_exit_or_syntax_error_scores_zero(cfg, sol):
    g = grade_pytest({"sol.py": sol}, ADD_TESTS, cfg)
    assert g.score == 0 and g.total == 2


@needs_root
def test_patching_pytest_in_process_is_caught(cfg):
    # Out of process the patch lands in the solution's process, where there is no pytest run to change.
    g = grade_pytest({"sol.py": PATCH_PYTEST + WRONG}, ADD_TESTS, cfg)
    assert g.score == 0 and g.trust == "out-of-process" and g.passed == 0
    g = grade_pytest({"sol.py": PATCH_PYTEST + WRONG}, ADD_TESTS, cfg, mode="in-process")
    assert g.score == 0 and "patched" in (g.error or "") and g.trust == "in-process"


def test_deleting_or_editing_tests(cfg):
    sol = """
        import glob, os
        for p in glob.glob("/tests/*.py") + glob.glob("*.py"):
            for action in (os.remove, lambda p: open(p, "w").write("def test_ok(): pass\\n")):
                try:
                    action(p)
                except OSError:
                    pass
        def add(a, b):
            return 0
    """
    g = grade_pytest({"sol.py": textwrap.dedent(sol)}, ADD_TESTS, cfg)
    assert g.score == 0 and g.total == 2


def test_unsafe_backend_refuses_without_opt_in():
    with pytest.raises(SandboxUnavailable, match="allow_unsafe"):
        run_command(["true"], {}, SandboxConfig(backend="unsafe"))
    with pytest.raises(SandboxUnavailable):
        grade_function("def f(): return 1", "f", [{"args": [], "expected": 1}], SandboxConfig(backend="unsafe"))
