"""Sandbox overhead: runs per second and per-run latency of each backend vs a plain subprocess.

Three workloads: a trivial Python program (`pass`), a grade_function call (5 cases), and a grade_pytest call
(2 tests; out-of-process, so two sandboxed processes; needs pytest in --pytest-python). Concurrency 1 and 2
(threads, as SandboxPool does). The trivial and grade_function rows use one interpreter (default
/usr/bin/python3: the unsafe backend's per-run uid cannot enter a root-only home, where a pyenv interpreter may
live). `bwrap-bare` is bwrap with this machine's seccomp filter, per-run cgroup and host mounts switched off,
to price those defences. Writes bench/results/sandbox.{json,md}.

usage: python bench/sandbox.py [--runs 20] [--python /usr/bin/python3] [--pytest-python PY]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from posttrain.sandbox import SandboxConfig, grade_function, grade_pytest, probe_backends, run_command
from posttrain.sandbox import run as run_mod
from posttrain.sandbox.channel import read_function_channel
from posttrain.sandbox.grading import HERE

CODE = "def sq(x):\n    return x * x\n"
CASES = [{"args": [i], "expected": i * i} for i in range(5)]
TESTS = {"test_sq.py": "from sol import sq\n\ndef test_a():\n    assert sq(2) == 4\n\n"
                      "def test_b():\n    assert sq(3) == 9\n"}
DEFENCES = (run_mod.seccomp_filter.build, run_mod.cgroups.probe, run_mod.mounts.probe)


def defences(on: bool) -> None:
    """Switch this process's seccomp filter, per-run cgroup and host mounts on or off (for the bwrap-bare rows)."""
    run_mod.seccomp_filter.build = DEFENCES[0] if on else (lambda: (None, "off for the bench"))
    run_mod.cgroups.probe = DEFENCES[1] if on else (lambda: "off for the bench")
    run_mod.mounts.probe = DEFENCES[2] if on else (lambda base: "off for the bench")
OUT = Path(__file__).parent / "results"


def plain_trivial(python: str) -> None:
    subprocess.run([python, "-c", "pass"], check=True, timeout=30, env={})


def plain_grade(python: str) -> None:
    """The same harness, same result pipe, no isolation and no limits: the floor for grade_function."""
    with tempfile.TemporaryDirectory() as d:
        Path(d, "cases.json").write_text(json.dumps([{"args": c["args"]} for c in CASES]))
        Path(d, "solution.py").write_text(CODE)
        r, w = os.pipe()
        p = subprocess.Popen([python, "-I", "-B", str(HERE / "harness_function.py"), str(w), f"{d}/cases.json",
                              f"{d}/solution.py", "sq", "5"], pass_fds=(w,), cwd=d, env={})
        os.close(w)
        with os.fdopen(r, "rb") as f:
            lines = read_function_channel(f.read(), len(CASES))
        p.wait(timeout=30)
        assert len(lines.values) == len(CASES)


def plain_pytest(python: str) -> None:
    """pytest on the same tests in one plain process: the floor for grade_pytest."""
    with tempfile.TemporaryDirectory() as d:
        Path(d, "sol.py").write_text(CODE)
        for k, v in TESTS.items():
            Path(d, k).write_text(v)
        subprocess.run([python, "-B", "-m", "pytest", "-q", "-p", "no:cacheprovider", d], cwd=d, check=True,
                       capture_output=True, timeout=60,
                       env={"PYTHONDONTWRITEBYTECODE": "1", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})


def make_job(kind: str, workload: str, python: str):
    if kind == "plain":
        return {"trivial": lambda: plain_trivial(python), "grade_function": lambda: plain_grade(python),
                "grade_pytest": lambda: plain_pytest(python)}[workload]
    cfg = SandboxConfig(backend=kind.replace("-bare", ""), allow_unsafe=True, python=python, timeout_s=30)
    if workload == "grade_pytest":
        def pytest_job():
            g = grade_pytest({"sol.py": CODE}, TESTS, cfg)
            assert g.score == 1.0 and g.trust == "out-of-process", (g.error, g.run and g.run.stderr[-500:])
        return pytest_job
    if workload == "trivial":
        def job():
            r = run_command([python, "-c", "pass"], {}, cfg)
            assert r.exit_code == 0, r.stderr
        return job

    def grade():
        g = grade_function(CODE, "sq", CASES, cfg)
        assert g.score == 1.0, g.error
    return grade


def measure(job, runs: int, concurrency: int, bare: bool = False) -> dict:
    defences(not bare)
    job()  # warm caches (interpreter probe, backend probe, page cache)
    lat: list[float] = []

    def timed(_):
        t = time.perf_counter()
        job()
        lat.append(time.perf_counter() - t)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as ex:
        list(ex.map(timed, range(runs)))
    wall = time.perf_counter() - t0
    return {"runs_per_s": runs / wall, "mean_ms": 1000 * statistics.mean(lat), "p50_ms": 1000 * statistics.median(lat),
            "p90_ms": 1000 * sorted(lat)[int(0.9 * (len(lat) - 1))]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--python", default="/usr/bin/python3")
    ap.add_argument("--pytest-python", default=sys.executable, help="an interpreter with pytest installed")
    args = ap.parse_args()
    reasons = probe_backends()
    kinds = ["plain"] + [b for b in ("unsafe", "unshare", "bwrap", "bwrap-bare")
                         if reasons[b.replace("-bare", "")] is None]
    rows = []
    load_before = os.getloadavg()
    for workload in ("trivial", "grade_function", "grade_pytest"):
        python = args.pytest_python if workload == "grade_pytest" else args.python
        for conc in (1, 2):
            base = None
            for kind in kinds:
                if workload == "grade_pytest" and kind == "unsafe":
                    continue  # out-of-process grading needs a namespaced backend
                m = measure(make_job(kind, workload, python), args.runs, conc, bare=kind.endswith("-bare"))
                base = m if kind == "plain" else base
                m.update(workload=workload, concurrency=conc, backend=kind,
                         overhead_ms=m["mean_ms"] - base["mean_ms"])
                rows.append(m)
                print(f"{workload:15s} c={conc} {kind:8s} {m['runs_per_s']:7.1f} runs/s  mean {m['mean_ms']:7.1f} ms"
                      f"  overhead {m['overhead_ms']:+7.1f} ms", flush=True)
    meta = {"python": args.python, "pytest_python": args.pytest_python, "runs": args.runs, "cpus": os.cpu_count(),
            "kernel": platform.release(), "skipped": {b: r for b, r in reasons.items() if r}, "euid": os.geteuid(),
            "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
            "note": "2-core machine shared with other work; numbers are indicative"}
    OUT.mkdir(exist_ok=True)
    (OUT / "sandbox.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = [f"### Sandbox overhead ({args.runs} runs per cell, {os.cpu_count()} CPUs, {args.python}; load average "
             f"{load_before[0]:.1f} before, {meta['loadavg_after'][0]:.1f} after)", "",
             "| workload | concurrency | backend | runs/s | mean ms | p50 ms | p90 ms | overhead vs plain, ms |",
             "|---|---:|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['workload']} | {r['concurrency']} | {r['backend']} | {r['runs_per_s']:.1f} | {r['mean_ms']:.1f} | "
              f"{r['p50_ms']:.1f} | {r['p90_ms']:.1f} | {r['overhead_ms']:+.1f} |" for r in rows]
    (OUT / "sandbox.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
