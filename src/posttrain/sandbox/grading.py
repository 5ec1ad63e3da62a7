"""Graders: the sandbox only produces outputs; expected values and the comparison stay on this side.

grade_function sends case inputs in and gets one JSON line per case back over a pipe (not stdout). grade_pytest
runs pristine, read-only test files against the solution and reads our own plugin's per-item lines. In both, a
case or test that did not report counts as failed, so exiting early, crashing or timing out never scores.
"""

from __future__ import annotations

import ast
import hashlib
import json
import math
import re
from pathlib import Path
from typing import Any

from posttrain.sandbox.config import GradeResult, RunResult, SandboxConfig
from posttrain.sandbox.run import run_sandboxed

HERE = Path(__file__).parent
FLOAT_TOL = 1e-6


def values_equal(expected: Any, got: Any) -> bool:
    """Strict JSON equality; floats (where expected is a float) within 1e-6, relative or absolute."""
    if isinstance(expected, bool) or expected is None or isinstance(expected, str):
        return type(got) is type(expected) and got == expected
    if isinstance(expected, float):
        return type(got) in (int, float) and math.isclose(got, expected, rel_tol=FLOAT_TOL, abs_tol=FLOAT_TOL)
    if isinstance(expected, int):
        return type(got) is int and got == expected
    if isinstance(expected, (list, tuple)):
        return type(got) is list and len(got) == len(expected) and all(map(values_equal, expected, got))
    if isinstance(expected, dict):
        return (type(got) is dict and set(got) == set(expected)
                and all(values_equal(v, got[k]) for k, v in expected.items()))
    raise TypeError(f"expected value of type {type(expected).__name__} is not JSON")


def _reject_constant(name: str) -> None:
    raise ValueError(f"non-finite number {name} in result channel")


def parse_lines(raw: bytes) -> list[dict]:
    """Result-channel lines that parse as JSON objects; anything else is ignored (it proves nothing)."""
    out = []
    for line in raw.decode("utf-8", "replace").splitlines():
        try:
            obj = json.loads(line, parse_constant=_reject_constant)
        except ValueError:
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out


def _result(per_case: list[bool], run: RunResult, error: str | None) -> GradeResult:
    passed = sum(per_case)
    total = len(per_case)
    return GradeResult(score=passed / total if total else 0.0, passed=passed, total=total, per_case=per_case,
                       isolation=run.isolation, error=error, timed_out=run.timed_out, duration_s=run.duration_s,
                       run=run)


def grade_function(code: str, entry_point: str, cases: list[dict], cfg: SandboxConfig | None = None) -> GradeResult:
    """Score `code`'s function `entry_point` on cases {"args": [...], "kwargs": {...}, "expected": value}.

    Only args and kwargs enter the sandbox. Score = fraction of cases whose returned value equals "expected"
    (exact JSON types; floats within 1e-6). Raises SandboxUnavailable if no allowed backend can run.
    """
    cfg = cfg or SandboxConfig()
    inputs_only = [{"args": list(c.get("args", [])), "kwargs": dict(c.get("kwargs", {}))} for c in cases]
    case_timeout = cfg.case_timeout_s or cfg.timeout_s
    inputs = {"harness_function.py": (HERE / "harness_function.py").read_bytes(),
              "cases.json": json.dumps(inputs_only), "solution.py": code}

    def argv(layout):
        return [cfg.python, "-I", "-B", f"{layout.inputs}/harness_function.py", "{result_fd}",
                f"{layout.inputs}/cases.json", f"{layout.inputs}/solution.py", entry_point, str(case_timeout)]

    run, raw, _ = run_sandboxed([], None, cfg, inputs=inputs, result_channel=True, argv_fn=argv)
    got: dict[int, Any] = {}
    seen_twice: set[int] = set()
    error = None
    for obj in parse_lines(raw):
        if "load_error" in obj and error is None:
            error = f"solution failed to load: {obj['load_error']}"
        i = obj.get("i")
        if type(i) is not int or not 0 <= i < len(cases):
            continue
        if i in got:
            seen_twice.add(i)  # two answers for one case: someone other than the harness wrote; trust neither
        got[i] = obj
    per_case = [i in got and i not in seen_twice and "v" in got[i] and values_equal(c["expected"], got[i]["v"])
                for i, c in enumerate(cases)]
    if error is None and len(got) < len(cases):
        error = "timed out" if run.timed_out else f"{len(cases) - len(got)} of {len(cases)} cases did not report"
    return _result(per_case, run, error)


_PARAM = re.compile(r"\[.*\]$")


def static_test_ids(rel: str, source: str) -> list[str]:
    """Test functions a file defines (module level, and methods of Test* classes), as pytest ids minus params.

    Counted outside the sandbox from the pristine source, so a solution that removes tests from collection
    (SkipTest at import, patched collection, a crash) still has them counted, as failures.
    """
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return [f"{rel}::<syntax error>"]
    ids = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            ids.append(f"{rel}::{node.name}")
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            ids += [f"{rel}::{node.name}::{m.name}" for m in node.body
                    if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) and m.name.startswith("test")]
    return ids or [f"{rel}::<no tests>"]


def grade_pytest(files: dict[str, str], test_files: dict[str, str], cfg: SandboxConfig | None = None) -> GradeResult:
    """Run pristine `test_files` against solution `files` with pytest; score = fraction of test items passed.

    Tests are mounted read-only, separate from the solution; conftest.py, ini files and plugins from the work
    dir are ignored; each test function found statically outside counts at least once, so tests that fail to
    collect, get skipped away, or never report count as failed. The test files' hashes are checked after the run.
    """
    cfg = cfg or SandboxConfig()
    if not test_files:
        raise ValueError("grade_pytest needs at least one test file")
    want_hash = {k: hashlib.sha256(v.encode()).hexdigest() for k, v in test_files.items()}
    inputs = {"harness_pytest.py": (HERE / "harness_pytest.py").read_bytes(), "pytest.ini": "[pytest]\n"}
    names = sorted(test_files)

    def argv(layout):
        return [cfg.python, "-I", "-B", f"{layout.inputs}/harness_pytest.py", "{result_fd}", layout.tests,
                layout.work, f"{layout.inputs}/pytest.ini", *names]

    run, raw, hashes = run_sandboxed([], files, cfg, inputs=inputs, tests=dict(test_files), result_channel=True,
                                     argv_fn=argv)
    if {k: hashes.get(str(Path(k))) for k in want_hash} != {k: want_hash[k] for k in want_hash}:
        return _result([False], run, "test files changed during the run")
    counts: dict[str, list[bool]] = {tid: [] for rel in names for tid in static_test_ids(rel, test_files[rel])}
    errors = []
    lines = parse_lines(raw)
    tampered = [str(o.get("what")) for o in lines if o.get("kind") == "tamper"]
    if tampered:
        return _result([False] * max(1, sum(len(v) or 1 for v in counts.values())), run,
                       "pytest machinery was patched during the run: " + ", ".join(tampered)[:500])
    for obj in lines:
        if obj.get("kind") == "item" and isinstance(obj.get("nodeid"), str):
            counts.setdefault(_PARAM.sub("", obj["nodeid"]), []).append(obj.get("passed") is True)
        elif obj.get("kind") == "collect_error":
            errors.append(str(obj.get("nodeid")))
        elif obj.get("kind") == "error":
            errors.append(str(obj.get("msg")))
    per_case = [ok for tid in counts for ok in (counts[tid] or [False])]
    error = None
    if errors:
        error = "collection errors: " + ", ".join(errors)[:500]
    elif run.timed_out:
        error = "timed out"
    elif any(not v for v in counts.values()):
        error = "some tests did not report: " + ", ".join(t for t, v in counts.items() if not v)[:500]
    return _result(per_case, run, error)
