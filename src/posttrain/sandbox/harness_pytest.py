"""Runs INSIDE the sandbox (started with `python -I`): run pristine tests against the solution with pytest.

The test files sit in a read-only dir, the solution in the writable work dir. Our own plugin writes one JSON
line per test item to the result fd; a JUnit XML or "passed" text the solution prints means nothing. No
conftest.py, no ini file from the work dir, no cache, no entry-point plugins, no bytecode.

usage: python -I harness_pytest.py RESULT_FD TESTS_DIR WORK_DIR INI_FILE TEST_FILE...
"""

import json
import os
import sys

WATCHED_MODULES = ["_pytest.runner", "_pytest.reports", "_pytest.python", "_pytest.main", "_pytest.skipping",
                   "_pytest.outcomes", "_pytest.fixtures", "_pytest.nodes", "_pytest.unittest", "_pytest.config",
                   "_pytest.assertion.rewrite", "_pytest.assertion.util", "pluggy._hooks", "pluggy._callers",
                   "pluggy._manager", "builtins", "json", "os"]


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
    """Identity of everything callable or descriptor-like on obj: patching any of these changes outcomes."""
    return {k: id(v) for k, v in list(vars(obj).items())
            if callable(v) or isinstance(v, (property, staticmethod, classmethod))}


def _snapshot():
    """Solution code shares this process with pytest, so it could patch pytest to pass everything. We record
    pytest's machinery before collection imports any solution code and compare at the end. This stops generic patches of
    pytest; a solution written against this harness could still get around it (see docs/sandbox.md)."""
    return {name: (obj, _behaviour(obj)) for name, obj in _watched_objects()}


def _changed(snapshot):
    import sys as _sys

    out = []
    for name, (obj, before) in snapshot.items():
        if "." in name and name in _sys.modules and _sys.modules[name] is not obj and name in WATCHED_MODULES:
            out.append(f"sys.modules[{name}] replaced")
        after = _behaviour(obj)
        out += [f"{name}.{k}" for k in set(before) | set(after) if before.get(k) != after.get(k)]
    return sorted(out)


def main():
    fd, tests_dir, work_dir, ini = sys.argv[1:5]
    test_files = sys.argv[5:]
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
    # Appended, not prepended: solution files must not shadow the stdlib or pytest's own modules.
    sys.path.append(work_dir)

    class Reporter:
        """Item passes only if setup, call and teardown all passed; skips and xfails do not pass."""

        def __init__(self):
            self.ok = {}
            self.watch = {}

        def pytest_sessionstart(self, session):
            # After pytest configured itself (it sets some attributes lazily), before collection imports tests.
            self.watch = _snapshot()

        def pytest_collectreport(self, report):
            if report.failed:
                emit({"kind": "collect_error", "nodeid": report.nodeid})

        def pytest_runtest_logreport(self, report):
            ok = self.ok.get(report.nodeid, True) and report.passed
            if report.when == "call" and getattr(report, "wasxfail", None) is not None:
                ok = False
            self.ok[report.nodeid] = ok
            if report.when == "call":
                self.ok[report.nodeid + "\0call"] = True
            if report.when == "teardown":
                called = self.ok.pop(report.nodeid + "\0call", False)
                emit({"kind": "item", "nodeid": report.nodeid, "passed": bool(ok and called)})

        def pytest_sessionfinish(self, session, exitstatus):
            changed = _changed(self.watch) if self.watch else ["snapshot missing"]
            if changed:
                emit({"kind": "tamper", "what": changed[:20]})
            emit({"kind": "done", "exitstatus": int(exitstatus)})

    args = ["-q", "-c", ini, "--rootdir", tests_dir, "-p", "no:cacheprovider", "--noconftest",
            "-p", "no:stepwise", "-p", "no:junitxml", "--tb=short", "-o", "addopts=",
            *[os.path.join(tests_dir, t) for t in test_files]]
    pytest.main(args, plugins=[Reporter()])


if __name__ == "__main__":
    main()
