"""Sandbox overhead: runs per second and per-run latency of each backend vs a plain subprocess.

Two workloads: a trivial Python program (`pass`) and a grade_function call (5 cases). Concurrency 1 and 2
(threads, as SandboxPool does). All rows use the same interpreter (default /usr/bin/python3: the unsafe backend's
per-run uid cannot enter a root-only home, where a pyenv interpreter may live). Writes
bench/results/sandbox.{json,md}.

usage: python bench/sandbox.py [--runs 20] [--python /usr/bin/python3]
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

from posttrain.sandbox import SandboxConfig, grade_function, probe_backends, run_command
from posttrain.sandbox.grading import HERE, parse_lines

CODE = "def sq(x):\n    return x * x\n"
CASES = [{"args": [i], "expected": i * i} for i in range(5)]
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
            lines = parse_lines(f.read())
        p.wait(timeout=30)
        assert len(lines) == len(CASES)


def make_job(kind: str, workload: str, python: str):
    if kind == "plain":
        return (lambda: plain_trivial(python)) if workload == "trivial" else (lambda: plain_grade(python))
    cfg = SandboxConfig(backend=kind, allow_unsafe=True, python=python, timeout_s=30)
    if workload == "trivial":
        def job():
            r = run_command([python, "-c", "pass"], {}, cfg)
            assert r.exit_code == 0, r.stderr
        return job

    def grade():
        g = grade_function(CODE, "sq", CASES, cfg)
        assert g.score == 1.0, g.error
    return grade


def measure(job, runs: int, concurrency: int) -> dict:
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
    args = ap.parse_args()
    reasons = probe_backends()
    kinds = ["plain"] + [b for b in ("unsafe", "unshare", "bwrap") if reasons[b] is None]
    rows = []
    for workload in ("trivial", "grade_function"):
        for conc in (1, 2):
            base = None
            for kind in kinds:
                m = measure(make_job(kind, workload, args.python), args.runs, conc)
                base = m if kind == "plain" else base
                m.update(workload=workload, concurrency=conc, backend=kind,
                         overhead_ms=m["mean_ms"] - base["mean_ms"])
                rows.append(m)
                print(f"{workload:15s} c={conc} {kind:8s} {m['runs_per_s']:7.1f} runs/s  mean {m['mean_ms']:7.1f} ms"
                      f"  overhead {m['overhead_ms']:+7.1f} ms", flush=True)
    meta = {"python": args.python, "runs": args.runs, "cpus": os.cpu_count(), "kernel": platform.release(),
            "skipped": {b: r for b, r in reasons.items() if r}, "euid": os.geteuid(),
            "note": "2-core machine shared with other work; numbers are indicative"}
    OUT.mkdir(exist_ok=True)
    (OUT / "sandbox.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = [f"### Sandbox overhead ({args.runs} runs per cell, {os.cpu_count()} CPUs, {args.python})", "",
             "| workload | concurrency | backend | runs/s | mean ms | p50 ms | p90 ms | overhead vs plain, ms |",
             "|---|---:|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['workload']} | {r['concurrency']} | {r['backend']} | {r['runs_per_s']:.1f} | {r['mean_ms']:.1f} | "
              f"{r['p50_ms']:.1f} | {r['p90_ms']:.1f} | {r['overhead_ms']:+.1f} |" for r in rows]
    (OUT / "sandbox.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
