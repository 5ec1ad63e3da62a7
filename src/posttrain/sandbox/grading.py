"""Graders: the sandbox only produces outputs; expected values, the comparison and the verdict stay on this side.

grade_function sends case inputs in and gets one JSON line per case back over a pipe (not stdout), then a
closing record; the values are compared here. grade_pytest runs pristine, read-only test files against the
solution; by default ("out-of-process") the tests and pytest run in one sandboxed process and the solution in
another, under another uid, reached only through a narrow call interface, so the solution never shares a process
or an fd with what reports the verdicts. In every mode the channel is checked by channel.py: ids from the
pristine tests only, each once, a closing record with the count, or the score is 0.

Nothing the sandbox sends can raise out of these functions: any failure to read or judge its output is a
score of 0 with an `error`. SandboxUnavailable (no allowed backend here) is the only exception, raised before
anything runs.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
from pathlib import Path

from posttrain.sandbox.backends import resolve_backend
from posttrain.sandbox.channel import ChannelError, base_id, read_function_channel, read_pytest_channel, values_equal
from posttrain.sandbox.config import GradeResult, RunResult, SandboxConfig
from posttrain.sandbox.limits import can_switch_uid
from posttrain.sandbox.run import run_sandboxed

HERE = Path(__file__).parent
OUT_OF_PROCESS, IN_PROCESS = "out-of-process", "in-process"
__all__ = ["grade_function", "grade_pytest", "static_test_ids", "values_equal", "OUT_OF_PROCESS", "IN_PROCESS"]


def _result(
    per_case: list[bool],
    run: RunResult,
    error: str | None,
    trust: str = OUT_OF_PROCESS,
    per_test: dict[str, bool] | None = None,
) -> GradeResult:
    passed = sum(per_case)
    total = len(per_case)
    return GradeResult(
        score=passed / total if total else 0.0,
        passed=passed,
        total=total,
        per_case=per_case,
        isolation=run.isolation,
        error=error,
        timed_out=run.timed_out,
        duration_s=run.duration_s,
        run=run,
        trust=trust,
        per_test=per_test,
    )


def _why_no_report(run: RunResult) -> str:
    if run.timed_out:
        return "timed out"
    if run.oom_killed:
        return "killed at the run's memory limit"
    return f"exit code {run.exit_code}"


def _judge_function(raw: bytes, cases: list[dict], run: RunResult) -> GradeResult:
    fail = [False] * len(cases)
    try:
        lines = read_function_channel(raw, len(cases))
    except ChannelError as e:
        return _result(fail, run, f"result channel rejected ({_why_no_report(run)}): {e}")
    if lines.load_error is not None:
        return _result(fail, run, f"solution failed to load: {lines.load_error}")
    per_case = []
    for i, c in enumerate(cases):
        try:
            per_case.append(i in lines.values and values_equal(c["expected"], lines.values[i]))
        except RecursionError:
            per_case.append(False)
    return _result(per_case, run, None)


def grade_function(code: str, entry_point: str, cases: list[dict], cfg: SandboxConfig | None = None) -> GradeResult:
    """Score `code`'s function `entry_point` on cases {"args": [...], "kwargs": {...}, "expected": value}.

    Only args and kwargs enter the sandbox. Score = fraction of cases whose returned value equals "expected"
    (exact JSON types; floats within 1e-6). Raises SandboxUnavailable if no allowed backend can run.
    """
    cfg = cfg or SandboxConfig()
    resolve_backend(cfg)
    inputs_only = [{"args": list(c.get("args", [])), "kwargs": dict(c.get("kwargs", {}))} for c in cases]
    case_timeout = cfg.case_timeout_s or cfg.timeout_s
    inputs = {
        "harness_function.py": (HERE / "harness_function.py").read_bytes(),
        "cases.json": json.dumps(inputs_only),
        "solution.py": code,
    }

    def argv(layout):
        return [
            cfg.python,
            "-I",
            "-B",
            f"{layout.inputs}/harness_function.py",
            "{result_fd}",
            f"{layout.inputs}/cases.json",
            f"{layout.inputs}/solution.py",
            entry_point,
            str(case_timeout),
        ]

    run, raw, _ = run_sandboxed([], None, cfg, inputs=inputs, result_channel=True, argv_fn=argv)
    try:
        return _judge_function(raw, cases, run)
    except Exception as e:  # noqa: BLE001 - a bug here must cost this sample, not the batch
        return _result([False] * len(cases), run, f"grader error: {type(e).__name__}: {str(e)[:200]}")


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
            ids += [
                f"{rel}::{node.name}::{m.name}"
                for m in node.body
                if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) and m.name.startswith("test")
            ]
    return ids or [f"{rel}::<no tests>"]


def top_level_names(files: dict[str, str]) -> list[str]:
    """Module names the solution's files provide at the top of the import path ("pkg/x.py" -> "pkg")."""
    names = set()
    for rel in files:
        first = Path(rel).parts[0]
        name = first[:-3] if first.endswith(".py") and len(Path(rel).parts) == 1 else first
        if name.isidentifier():
            names.add(name)
    return sorted(names)


def default_mode(cfg: SandboxConfig) -> str:
    """Out-of-process wherever it can run: a namespaced backend and root (a uid for each process)."""
    backend = resolve_backend(cfg)
    return OUT_OF_PROCESS if backend != "unsafe" and can_switch_uid() else IN_PROCESS


def _judge_pytest(
    raw: bytes, hashes: dict[str, str], test_files: dict[str, str], run: RunResult, mode: str
) -> GradeResult:
    ids = {rel: static_test_ids(rel, src) for rel, src in test_files.items()}
    static = {tid for v in ids.values() for tid in v}
    fail = [False] * len(static)
    want_hash = {k: hashlib.sha256(v.encode()).hexdigest() for k, v in test_files.items()}
    if any(hashes.get(os.path.normpath(k)) != h for k, h in want_hash.items()):
        return _result(fail, run, "test files changed during the run", mode)
    try:
        lines = read_pytest_channel(raw, static, max_items=100 * len(static) + 1000)
    except ChannelError as e:
        return _result(fail, run, f"result channel rejected ({_why_no_report(run)}): {e}", mode)
    if lines.tampered:
        return _result(
            fail, run, "pytest machinery was patched during the run: " + ", ".join(lines.tampered)[:500], mode
        )
    reported: dict[str, list[bool]] = {tid: [] for tid in sorted(static)}
    for nodeid, ok in lines.passed.items():
        reported[base_id(nodeid)].append(ok)
    per_case = [ok for tid in reported for ok in (reported[tid] or [False])]
    if lines.link_timeout is not None:  # the items count (a solution that hangs fails), the per-test map does not
        return _result(
            per_case,
            run,
            f"the solution process stopped answering in time ({lines.link_timeout}); per-test verdicts unknown",
            mode,
        )
    error = None
    if lines.collect_errors or lines.errors:
        error = "collection errors: " + ", ".join(lines.collect_errors + lines.errors)[:500]
    elif any(not v for v in reported.values()):
        error = "some tests did not report: " + ", ".join(t for t, v in reported.items() if not v)[:500]
    return _result(per_case, run, error, mode, {tid: bool(v) and all(v) for tid, v in reported.items()})


def grade_pytest(
    files: dict[str, str], test_files: dict[str, str], cfg: SandboxConfig | None = None, mode: str | None = None
) -> GradeResult:
    """Run pristine `test_files` against solution `files` with pytest; score = fraction of test items passed.

    `mode` "out-of-process" (the default where the machine allows it: root and a namespaced backend) or
    "in-process" (the solution imported next to pytest; GradeResult.trust says so). Tests are mounted
    read-only, separate from the solution; conftest.py, ini files and plugins from the work dir are ignored;
    each test function found statically here counts at least once, so tests that fail to collect, get skipped
    away, or never report count as failed. The test files' hashes are checked after the run.

    `per_test` (test id -> passed) holds only verdicts: None when the run ended before a complete, untampered
    report (timed out, killed, OOM-killed, a broken channel, a changed test file, patched pytest machinery, a
    grader error). `score` is 0 then either way (a solution that hangs fails), but a per-test map of all-failed
    would claim tests failed that never ran to a verdict, and a repair task's baseline (the untouched code's
    grade, rewards/repair_grades.py) taken from it would pay untouched code for "fixing" them.
    """
    cfg = cfg or SandboxConfig()
    if not test_files:
        raise ValueError("grade_pytest needs at least one test file")
    mode = mode or default_mode(cfg)
    if mode not in (OUT_OF_PROCESS, IN_PROCESS):
        raise ValueError(f"mode must be {OUT_OF_PROCESS!r} or {IN_PROCESS!r}, not {mode!r}")
    inputs: dict[str, str | bytes] = {
        name: (HERE / name).read_bytes()
        for name in ("harness_pytest.py", "harness_remote.py", "harness_wire.py", "harness_solution.py")
    }
    inputs["pytest.ini"] = "[pytest]\n"
    names = sorted(test_files)
    call_timeout = cfg.case_timeout_s or cfg.timeout_s

    def argv(layout):
        head = [cfg.python, "-I", "-B", f"{layout.inputs}/harness_pytest.py", mode, "{result_fd}"]
        if mode == IN_PROCESS:
            return head + [layout.work, layout.tests, f"{layout.inputs}/pytest.ini", *names]
        return head + [
            "{rpc_req}",
            "{rpc_reply}",
            ",".join(top_level_names(files)),
            str(call_timeout),
            layout.tests,
            f"{layout.inputs}/pytest.ini",
            *names,
        ]

    def solution_argv(layout):
        return [cfg.python, "-I", "-B", f"{layout.inputs}/harness_solution.py", "{rpc_req}", "{rpc_reply}", layout.work]

    run, raw, hashes = run_sandboxed(
        [],
        files,
        cfg,
        inputs=inputs,
        tests=dict(test_files),
        result_channel=True,
        argv_fn=argv,
        companion_fn=solution_argv if mode == OUT_OF_PROCESS else None,
    )
    try:
        return _judge_pytest(raw, hashes, test_files, run, mode)
    except Exception as e:  # noqa: BLE001 - a bug here must cost this sample, not the batch
        return _result([False], run, f"grader error: {type(e).__name__}: {str(e)[:200]}", mode)
