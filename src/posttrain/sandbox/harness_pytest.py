"""Runs INSIDE the sandbox (started with `python -I`): run pristine tests against the solution with pytest.

Two modes. `out-of-process` (the default): this process holds pytest, the pristine tests and the result fd, and
runs as a uid of its own; the solution runs in another process under another uid (harness_solution.py) and the
tests reach it only through proxies (harness_remote.py), so nothing the solution does can reach pytest or the
result channel. `in-process`: the solution is imported here, next to pytest, as before; whatever this process
reports can be forged, which GradeResult.trust says. Both write one JSON line per test item and then a closing
record with the item count; a JUnit XML or "passed" text the solution prints means nothing. No conftest.py, no
ini file from the work dir, no cache, no entry-point plugins, no bytecode.

usage: python -I harness_pytest.py out-of-process RESULT_FD REQ_FD REPLY_FD TOP_NAMES CALL_TIMEOUT_S TESTS_DIR
                                   INI_FILE TEST_FILE...
       python -I harness_pytest.py in-process RESULT_FD WORK_DIR TESTS_DIR INI_FILE TEST_FILE...
"""

import json
import os
import sys

WATCHED_MODULES = [
    "_pytest.runner",
    "_pytest.reports",
    "_pytest.python",
    "_pytest.main",
    "_pytest.skipping",
    "_pytest.outcomes",
    "_pytest.fixtures",
    "_pytest.nodes",
    "_pytest.unittest",
    "_pytest.config",
    "_pytest.assertion.rewrite",
    "_pytest.assertion.util",
    "pluggy._hooks",
    "pluggy._callers",
    "pluggy._manager",
    "builtins",
    "json",
    "os",
]


def _watched_objects():
    import importlib
    import inspect

    for name in WATCHED_MODULES:
        mod = importlib.import_module(name)
        yield name, mod
        for attr, val in list(vars(mod).items()):
            if inspect.isclass(val) and getattr(val, "__module__", None) == name:
                yield f"{name}.{attr}", val


def _behaviour(obj):
    """Everything callable or descriptor-like on obj (the objects themselves, held, so a replaced one is seen even
    after the original is freed): patching any of these changes outcomes."""
    return {
        k: v for k, v in list(vars(obj).items()) if callable(v) or isinstance(v, (property, staticmethod, classmethod))
    }


def _snapshot():
    """Solution code shares this process with pytest, so it could patch pytest to pass everything. We record
    pytest's machinery before collection imports any solution code and compare at the end. This stops generic patches of
    pytest; a solution written against this harness could still get around it (see docs/sandbox.md)."""
    return {name: (obj, _behaviour(obj)) for name, obj in _watched_objects()}


# Set and reset by pytest itself around every test (assertion rewriting's hooks), not by a solution.
PYTEST_TOGGLES = {
    "_pytest.assertion.util._reprcompare",
    "_pytest.assertion.util._assertion_pass",
    "_pytest.assertion.util._config",
}


def _changed(snapshot):
    import sys as _sys

    out = []
    for name, (obj, before) in snapshot.items():
        if "." in name and name in _sys.modules and _sys.modules[name] is not obj and name in WATCHED_MODULES:
            out.append(f"sys.modules[{name}] replaced")
        after = _behaviour(obj)
        out += [
            f"{name}.{k}"
            for k in set(before) | set(after)
            if k not in before or k not in after or before[k] is not after[k]
        ]
    return sorted(set(out) - PYTEST_TOGGLES)


def _no_dumps():
    """Not dumpable: /proc/<pid>/fd and ptrace of this process are then closed to every other uid-equal
    process, a second wall (after the separate uid) around the result fd."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except (OSError, AttributeError):
        pass


def main():
    _no_dumps()
    mode, fd = sys.argv[1:3]
    if mode == "out-of-process":
        req_fd, reply_fd, tops, call_timeout, tests_dir, ini = sys.argv[3:9]
        test_files = sys.argv[9:]
        work_dir = None
    else:
        work_dir, tests_dir, ini = sys.argv[3:6]
        test_files = sys.argv[6:]
    out = os.fdopen(int(fd), "w", buffering=1)

    def emit(obj):
        out.write(json.dumps(obj) + "\n")
        out.flush()

    # A dist-info with a pytest11 entry point dropped in the work dir would otherwise load as a plugin.
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    os.environ.pop("PYTEST_ADDOPTS", None)
    sys.dont_write_bytecode = True
    try:
        import pytest
    except ImportError as e:
        emit({"kind": "error", "msg": f"pytest is not importable inside the sandbox: {e}"})
        return
    conn = None
    if work_dir is None:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # -I leaves the script's dir out
        import harness_remote  # pyright: ignore[reportMissingImports]  # a sibling script, on sys.path in the sandbox

        conn = harness_remote.Connection(int(req_fd), int(reply_fd), float(call_timeout))
        sys.meta_path.append(harness_remote.SolutionFinder(conn, [t for t in tops.split(",") if t]))
    else:
        # Appended, not prepended: solution files must not shadow the stdlib or pytest's own modules.
        sys.path.append(work_dir)

    class Reporter:
        """Item passes only if setup, call and teardown all passed; skips and xfails do not pass."""

        def __init__(self):
            self.ok = {}
            self.watch = {}
            self.items = 0
            self.plugins = None
            self.tamper_sent = False

        @pytest.hookimpl(tryfirst=True)
        def pytest_collection(self, session):
            # After pytest configured itself and started the session (it sets some attributes lazily, registers
            # its fixture manager), before collection imports the tests and so the solution.
            if work_dir is not None:
                self.watch = _snapshot()
                self.plugins = list(session.config.pluginmanager.get_plugins())
                self.pm = session.config.pluginmanager

        def check(self, final=False):
            """In-process only, and only a tripwire: checked at every report, not just at the end, so a patch
            that restores itself before the session ends is still seen if it was on while a test reported.
            Between tests only pytest's and pluggy's own objects count: a pristine test may monkeypatch `os`
            or `json` for its duration."""
            if work_dir is None:
                return []
            changed = _changed(self.watch) if self.watch else ["snapshot missing"]
            if not final:
                changed = [c for c in changed if c.startswith(("_pytest", "pluggy", "snapshot"))]
            if self.plugins is not None:
                changed += [
                    f"plugin registered at run time: {self.pm.get_name(p)}"
                    for p in self.pm.get_plugins()
                    if not any(p is q for q in self.plugins)
                ]
            return changed

        def pytest_collectreport(self, report):
            if report.failed:
                emit({"kind": "collect_error", "nodeid": report.nodeid})

        def pytest_runtest_logreport(self, report):
            changed = self.check()
            if changed and not self.tamper_sent:
                emit({"kind": "tamper", "what": changed[:20]})
                self.tamper_sent = True
            ok = self.ok.get(report.nodeid, True) and report.passed and not changed
            if report.when == "call" and getattr(report, "wasxfail", None) is not None:
                ok = False
            self.ok[report.nodeid] = ok
            if report.when == "call":
                self.ok[report.nodeid + "\0call"] = True
            if report.when == "teardown":
                called = self.ok.pop(report.nodeid + "\0call", False)
                emit({"kind": "item", "nodeid": report.nodeid, "passed": bool(ok and called)})
                self.items += 1

        def pytest_sessionfinish(self, session, exitstatus):
            changed = self.check(final=True)
            if changed and not self.tamper_sent:
                emit({"kind": "tamper", "what": changed[:20]})
            if conn is not None and conn.timed_out:
                emit({"kind": "link", "why": str(conn.dead)[:200]})
            emit({"kind": "done", "count": self.items})

    args = [
        "-q",
        "-c",
        ini,
        "--rootdir",
        tests_dir,
        "-p",
        "no:cacheprovider",
        "--noconftest",
        "-p",
        "no:stepwise",
        "-p",
        "no:junitxml",
        "--tb=short",
        "-o",
        "addopts=",
        *[os.path.join(tests_dir, t) for t in test_files],
    ]
    pytest.main(args, plugins=[Reporter()])


if __name__ == "__main__":
    main()
