"""Classes 1-3 of issue #11: forged verdicts, runtime tampering with the test runner, a host grader that trusts
what comes back. Every attack here is a wrong solution trying to raise its reward, or sandbox output trying to
crash or stall the host; each must score 0 with the grader returning normally (host_guard checks the host)."""

import asyncio
import textwrap
import time

import pytest
from sbhelpers import needs_root

from posttrain.sandbox import SandboxPool, grade_function, grade_pytest
from posttrain.sandbox import pool as pool_mod

TESTS = {"test_add.py": "from sol import add\n\ndef test_a():\n    assert add(1, 2) == 3\n\n"
                        "def test_b():\n    assert add(2, 2) == 4\n\ndef test_c():\n    assert add(0, 0) == 0\n"}
WRONG = "def add(a, b):\n    return -1\n"
CASES = [{"args": [i, 2], "expected": i + 2} for i in range(4)]

# Writes "passed" for every test found in the readable test files, plus a closing record, into every pipe it
# can reach (its own fds, and every /proc/<pid>/fd it can open), then exits before any real verdict.
FORGE = textwrap.dedent('''
    import glob, json, os, re, stat
    ids = []
    for p in glob.glob("/tests/**/*.py", recursive=True):
        rel = os.path.relpath(p, "/tests")
        ids += [rel + "::" + m for m in re.findall(r"^def (test\\w*)", open(p).read(), re.M)]
    data = "".join(json.dumps({"kind": "item", "nodeid": i, "passed": True}) + "\\n" for i in ids)
    data = (data + json.dumps({"kind": "done", "count": len(ids)}) + "\\n").encode()
    for fd in range(3, 256):
        try:
            if stat.S_ISFIFO(os.fstat(fd).st_mode):
                os.write(fd, data)
        except OSError:
            pass
    for p in glob.glob("/proc/[0-9]*/fd/*"):
        try:
            fd = os.open(p, os.O_WRONLY | os.O_NONBLOCK)
            os.write(fd, data)
        except OSError:
            pass
    os._exit(0)
''')


def write_to_channel(lines: str) -> str:
    """Solution source that writes `lines` (a Python expression giving bytes) to every pipe fd it holds, then
    exits: in-process, one of them is the result channel."""
    return textwrap.dedent(f'''
        import os, stat
        data = {lines}
        for fd in range(3, 256):
            try:
                if stat.S_ISFIFO(os.fstat(fd).st_mode):
                    os.write(fd, data)
            except OSError:
                pass
        os._exit(0)
    ''')


# ---- class 1: forged verdicts -----------------------------------------------------------------------------------

@needs_root
def test_forged_item_lines_out_of_process_score_zero(cfg):
    g = grade_pytest({"sol.py": FORGE + WRONG}, TESTS, cfg)
    assert g.trust == "out-of-process" and g.score == 0 and g.passed == 0 and g.total == 3


def test_in_process_verdicts_are_labelled_forgeable(cfg):
    # The reason out-of-process is the default: the same attack in-process forges a full score. The label says so.
    g = grade_pytest({"sol.py": FORGE + WRONG}, TESTS, cfg, mode="in-process")
    assert g.trust == "in-process"


@pytest.mark.parametrize("lines,why", [
    ('b"".join(b\'{"kind": "item", "nodeid": "test_add.py::test_x%d", "passed": true}\\n\' % i for i in range(500))'
     ' + b\'{"kind": "done", "count": 500}\\n\'', "not in the pristine tests"),
    ('b\'{"kind": "item", "nodeid": "test_add.py::test_a", "passed": true}\\n\' * 2'
     ' + b\'{"kind": "done", "count": 2}\\n\'', "two results"),
    ('b"".join(b\'{"kind": "item", "nodeid": "test_add.py::test_%s", "passed": true}\\n\' % c'
     ' for c in [b"a", b"b", b"c"])',
     "no closing record"),
], ids=["unknown-ids", "repeated-id", "no-closing-record"])
def test_channel_protocol_breaks_score_zero(cfg, lines, why):
    g = grade_pytest({"sol.py": write_to_channel(lines)}, TESTS, cfg, mode="in-process")
    assert g.score == 0 and why in (g.error or ""), g.error


@pytest.mark.parametrize("lines,why", [
    ('b\'{"i": 0, "v": 2}\\n{"i": 0, "v": 2}\\n{"done": 2}\\n\'', "twice"),
    ('b\'{"i": 9, "v": 2}\\n{"done": 1}\\n\'', "unknown case"),
    ('b\'{"i": 0, "v": 2}\\n{"i": 1, "v": 3}\\n{"i": 2, "v": 4}\\n{"i": 3, "v": 5}\\n\'', "no closing record"),
], ids=["repeated", "unknown", "no-closing-record"])
def test_function_channel_protocol_breaks_score_zero(cfg, lines, why):
    g = grade_function(write_to_channel(lines) + WRONG, "add", CASES, cfg)
    assert g.score == 0 and why in (g.error or ""), g.error


# ---- class 2: runtime tampering with the test runner -----------------------------------------------------------

# Looks for pytest's plugin manager anywhere it can reach (the stack, the gc) and registers a plugin that marks
# every report passed; also patches reporting and restores the patch when the process exits.
TAMPER = textwrap.dedent('''
    import atexit, gc, sys
    class Plug:
        def pytest_runtest_logreport(self, report):
            report.outcome = "passed"
    found = 0
    f = sys._getframe(0)
    while f is not None:
        for v in list(f.f_locals.values()):
            pm = getattr(getattr(v, "config", None), "pluginmanager", None)
            if pm is not None:
                pm.register(Plug(), "evil%d" % found); found += 1
        f = f.f_back
    for o in gc.get_objects():
        if type(o).__name__ == "PytestPluginManager":
            o.register(Plug(), "evil%d" % found); found += 1
    try:
        import _pytest.reports as R
        saved = R.BaseReport.passed
        R.BaseReport.passed = property(lambda self: True)
        atexit.register(lambda: setattr(R.BaseReport, "passed", saved))
    except ImportError:
        pass
''')


@needs_root
def test_runtime_plugin_and_self_restoring_patch_score_zero(cfg):
    g = grade_pytest({"sol.py": TAMPER + WRONG}, TESTS, cfg)
    assert g.trust == "out-of-process" and g.score == 0 and g.passed == 0


def test_runtime_plugin_in_process_is_caught(cfg):
    g = grade_pytest({"sol.py": TAMPER + WRONG}, TESTS, cfg, mode="in-process")
    assert g.score == 0 and "plugin registered at run time" in (g.error or "")


@needs_root
def test_always_equal_and_subclass_returns_cannot_pass_remote_asserts(cfg):
    sol = textwrap.dedent('''
        class Eq:
            def __eq__(self, o): return True
            def __bool__(self): return True
        class I(int):
            def __eq__(self, o): return True
            __hash__ = int.__hash__
        def add(a, b):
            return [Eq(), I(0), Eq()][a % 3]
    ''')
    g = grade_pytest({"sol.py": sol}, TESTS, cfg)
    assert g.score == 0 and g.total == 3


# ---- class 3: the host grader trusts what comes back -----------------------------------------------------------

@pytest.mark.parametrize("lines", [
    'b\'{"i": 0, "v": \' + b"9" * 4000'
    ' + b\'}\\n{"i": 1, "v": 1}\\n{"i": 2, "v": 1}\\n{"i": 3, "v": 1}\\n{"done": 4}\\n\'',
    'b\'{"i": 0, "v": \' + b"[" * 200000 + b"]" * 200000 + b\'}\\n{"done": 1}\\n\'',
    'b"\\xff\\xfe" * 100000 + b"\\n"',
], ids=["huge-int-vs-float", "nested-json", "binary"])
def test_hostile_channel_bytes_do_not_raise(cfg, lines):
    cases = [{"args": [i, 2], "expected": float(i + 2)} for i in range(4)]
    g = grade_function(write_to_channel(lines) + WRONG, "add", cases, cfg)
    assert g.score == 0


def test_huge_int_return_value_against_float_expected(cfg):
    cases = [{"args": [1, 2], "expected": 3.0}]
    g = grade_function("import sys\nsys.set_int_max_str_digits(0)\ndef add(a, b):\n    return 10 ** 400\n",
                       "add", cases, cfg)
    assert g.score == 0


def test_pathological_test_id_is_linear_time(cfg):
    # Made to hit a backtracking regex over ids (the old "\\[.*\\]$"): quadratic in the '[' count.
    lines = 'b\'{"kind": "item", "nodeid": "test_add.py::test_a\' + b"[" * 1500000 + b\'", "passed": true}\\n\''
    t = time.monotonic()
    g = grade_pytest({"sol.py": write_to_channel(lines)}, TESTS, cfg, mode="in-process")
    host_s = time.monotonic() - t - g.duration_s
    assert g.score == 0 and host_s < 2.0, (host_s, g.error)


def test_pool_batch_survives_a_sample_that_raises(cfg, monkeypatch):
    real = pool_mod.grade_function

    def flaky(code, *a):
        if "BOOM" in code:
            raise RecursionError("a grader bug")
        return real(code, *a)

    monkeypatch.setattr(pool_mod, "grade_function", flaky)
    jobs = [("def add(a, b):\n    return a + b\n", "add", CASES), ("# BOOM\n", "add", CASES)]
    results = asyncio.run(SandboxPool(cfg).grade_many(jobs))
    assert results[0].score == 1.0 and results[1].score == 0 and "RecursionError" in results[1].error

