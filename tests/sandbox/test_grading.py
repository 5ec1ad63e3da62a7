"""Positive grading: correct solutions score 1.0, partial ones the right fraction; the comparison rules."""

import asyncio
import os

import pytest
from sbhelpers import needs_root

from posttrain.sandbox import GradeResult, SandboxConfig, SandboxPool, detect_backend, grade_function, grade_pytest
from posttrain.sandbox.grading import static_test_ids, values_equal

CASES = [{"args": [i], "expected": i * i} for i in range(5)]


def test_correct_function_scores_one(cfg):
    g = grade_function("def sq(x):\n    return x * x\n", "sq", CASES, cfg)
    assert (g.score, g.passed, g.total, g.error) == (1.0, 5, 5, None) and g.isolation == cfg.backend


def test_partial_function_scores_fraction(cfg):
    g = grade_function("def sq(x):\n    return x * x if x < 2 else -1\n", "sq", CASES, cfg)
    assert g.score == pytest.approx(2 / 5) and g.per_case == [True, True, False, False, False]


def test_one_crashing_case_does_not_sink_the_rest(cfg):
    code = "import time\ndef sq(x):\n    if x == 1: raise ValueError\n    if x == 2: time.sleep(30)\n    return x * x\n"
    g = grade_function(code, "sq", CASES, cfg.model_copy(update={"case_timeout_s": 1.0}))
    assert g.per_case == [True, False, False, True, True]


def test_kwargs_floats_tuples_and_nesting(cfg):
    code = ("def f(x, scale=1.0):\n    return {'v': x * scale, 'pair': (x, 'a'), 'ok': True}\n")
    cases = [{"args": [1], "kwargs": {"scale": 0.1}, "expected": {"v": 0.1, "pair": [1, "a"], "ok": True}},
             {"args": [3], "kwargs": {"scale": 1 / 3}, "expected": {"v": 1.0, "pair": [3, "a"], "ok": True}},
             {"args": [2], "expected": {"v": 2.5, "pair": [2, "a"], "ok": True}}]
    assert grade_function(code, "f", cases, cfg).per_case == [True, True, False]


def test_missing_entry_point_is_an_error(cfg):
    g = grade_function("def other(): pass\n", "sq", CASES, cfg)
    assert g.score == 0 and "AttributeError" in g.error


TESTS = {"test_sq.py": "import pytest\nfrom sol import sq\n\n@pytest.mark.parametrize('x', [0, 1, 2, 3])\n"
                       "def test_sq(x):\n    assert sq(x) == x * x\n\nclass TestMore:\n"
                       "    def test_neg(self):\n        assert sq(-2) == 4\n"}


@pytest.mark.parametrize("mode", ["out-of-process", "in-process"])
def test_correct_pytest_scores_one(cfg, mode):
    if mode == "out-of-process" and os.geteuid() != 0:
        pytest.skip("out-of-process grading needs root")
    g = grade_pytest({"sol.py": "def sq(x):\n    return x * x\n"}, TESTS, cfg, mode=mode)
    assert (g.score, g.total, g.error, g.trust) == (1.0, 5, None, mode)


@pytest.mark.parametrize("mode", ["out-of-process", "in-process"])
def test_partial_pytest_scores_fraction(cfg, mode):
    if mode == "out-of-process" and os.geteuid() != 0:
        pytest.skip("out-of-process grading needs root")
    g = grade_pytest({"sol.py": "def sq(x):\n    return x * x if x < 2 else 0\n", "helper/x.txt": "data"}, TESTS, cfg,
                     mode=mode)
    assert g.total == 5 and g.passed == 3 and g.score == pytest.approx(0.6)
    # per test id: a parametrized test passes only when every case does
    assert g.per_test == {"test_sq.py::TestMore::test_neg": True, "test_sq.py::test_sq": False}
    broken = grade_pytest({"sol.py": "def sq(x) return\n"}, TESTS, cfg, mode=mode)  # does not import
    assert broken.per_test == {"test_sq.py::TestMore::test_neg": False, "test_sq.py::test_sq": False}


# What the proxies must carry for ordinary tests: classes, instances, methods, attributes, the solution's own
# exception classes with pytest.raises, containers both ways, and operators between solution objects.
PKG_TESTS = {"test_pkg.py": """import pytest
from pkg.store import Store, Missing, make_pair


def test_objects_and_exceptions():
    s = Store()
    s.put("a", 2)
    s.put("b", [1, (2, 3)])
    assert s.get("a") == 2 and s.get("b") == [1, (2, 3)] and s.items == {"a": 2, "b": [1, (2, 3)]}
    assert len(s) == 2 and "a" in s and sorted(s) == ["a", "b"] and s["a"] == 2
    with pytest.raises(Missing):
        s.get("zzz")
    with pytest.raises(KeyError):
        s.get("zzz")
    with pytest.raises(ValueError, match="negative"):
        s.put("c", -1)


def test_values_and_equality():
    p, q = make_pair(1, 2), make_pair(1, 2)
    assert p == q and p != make_pair(2, 1) and p.total() == 3 and str(p) == "(1, 2)"
    assert p != (1, 2)  # a solution object never equals a value of the test's own
    assert {1.5, 2.5} == Store().floats({1.5, 2.5}) and Store().floats(b"xy") == b"xy"
"""}
PKG = {"pkg/__init__.py": "", "pkg/store.py": """
class Missing(KeyError):
    pass


class Store:
    def __init__(self):
        self.items = {}

    def put(self, k, v):
        if isinstance(v, int) and v < 0:
            raise ValueError("negative")
        self.items[k] = v

    def get(self, k):
        if k not in self.items:
            raise Missing(k)
        return self.items[k]

    def __len__(self):
        return len(self.items)

    def __contains__(self, k):
        return k in self.items

    def __iter__(self):
        return iter(self.items)

    def __getitem__(self, k):
        return self.items[k]

    def floats(self, x):
        return x


class Pair:
    def __init__(self, a, b):
        self.a, self.b = a, b

    def __eq__(self, o):
        return isinstance(o, Pair) and (self.a, self.b) == (o.a, o.b)

    def total(self):
        return self.a + self.b

    def __str__(self):
        return f"({self.a}, {self.b})"


def make_pair(a, b):
    return Pair(a, b)
"""}


@pytest.mark.parametrize("mode", ["out-of-process", "in-process"])
def test_proxies_carry_ordinary_tests(cfg, mode):
    if mode == "out-of-process" and os.geteuid() != 0:
        pytest.skip("out-of-process grading needs root")
    g = grade_pytest(PKG, PKG_TESTS, cfg, mode=mode)
    assert (g.score, g.total, g.error) == (1.0, 2, None), g.run.stdout[-3000:]


def test_pool_fans_out(cfg):
    pool = SandboxPool(cfg.model_copy(update={"concurrency": 2}))
    jobs = [("def sq(x):\n    return x * x\n", "sq", CASES), ("def sq(x):\n    return 0\n", "sq", CASES)] * 2

    async def go():
        return await pool.grade_many(jobs)

    results = asyncio.run(go())
    assert [r.score for r in results] == [1.0, pytest.approx(0.2), 1.0, pytest.approx(0.2)]
    assert all(isinstance(r, GradeResult) for r in results)


def test_values_equal_is_strict():
    assert values_equal(1.0, 1.0000001) and values_equal(1.0, 1) and not values_equal(1.0, 1.1)
    assert not values_equal(1, True) and not values_equal(1, 1.0) and not values_equal("1", 1)
    assert values_equal([1, {"a": [None]}], [1, {"a": [None]}]) and not values_equal([1], [1, 2])
    assert not values_equal({"a": 1}, {"a": 1, "b": 2}) and not values_equal(True, 1)


def test_static_test_ids():
    src = ("def test_a(): pass\nclass TestB:\n    def test_c(self): pass\n    def helper(self): pass\n"
           "def helper(): pass\n")
    assert static_test_ids("t.py", src) == ["t.py::test_a", "t.py::TestB::test_c"]
    assert static_test_ids("t.py", "def (:") == ["t.py::<syntax error>"]


def test_detect_backend_names_one():
    assert detect_backend() in ("bwrap", "unshare", "unsafe")


def test_unsafe_backend_runs_when_allowed():
    # The venv's interpreter may live under a root-only home, so the unsafe run uses the system Python.
    cfg = SandboxConfig(backend="unsafe", allow_unsafe=True, python="/usr/bin/python3", timeout_s=5)
    g = grade_function("def sq(x):\n    return x * x\n", "sq", CASES, cfg)
    assert g.isolation == "unsafe" and g.score == 1.0



PIPE_ON_TARGET = """
import os, sys
from posttrain.sandbox import SandboxConfig, grade_pytest, run_command
target, backend, staging = int(sys.argv[1]), sys.argv[2], sys.argv[3]
cfg = SandboxConfig(backend=backend, staging_dir=staging, timeout_s=10)
run_command(["true"], {}, cfg)  # warms the cached probes, which make pipes of their own
real_pipe, calls = os.pipe, []
def pipe_on_target():  # the first pipe run_sandboxed makes is the result channel
    r, w = real_pipe()
    if not calls:
        calls.append(w)
        if w != target:
            os.dup2(w, target); os.close(w); w = target
    return r, w
os.pipe = pipe_on_target
tests = {"test_sq.py": "from sol import sq\\ndef test_a():\\n    assert sq(3) == 9\\n"}
g = grade_pytest({"sol.py": "def sq(x):\\n    return x * x\\n"}, tests, cfg)
print("RESULT", g.score, g.error, g.trust)
"""


@needs_root
@pytest.mark.parametrize("target", [5, 7, 8, 9])
def test_out_of_process_pytest_whatever_fd_the_result_pipe_gets(cfg, target):
    # The two processes' pipes use single-digit fds inside; a result pipe on the same number was overwritten
    # (seen under the CLI, whose open files put it on 7). A fresh process, so fds 3-9 are free to aim at.
    import subprocess
    import sys

    from conftest import STAGING

    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": os.pathsep.join(sys.path)}
    p = subprocess.run([sys.executable, "-c", PIPE_ON_TARGET, str(target), cfg.backend, STAGING],
                       capture_output=True, text=True, timeout=60, env=env)
    assert "RESULT 1.0 None out-of-process" in p.stdout, p.stdout + p.stderr[-2000:]
