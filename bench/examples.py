"""Run each example's documented command and print held-out pass rate before/after and wall time.

    python bench/examples.py                       # every example, seeds 0 1 2, one run at a time
    python bench/examples.py --only custom_task --seeds 0
    python bench/examples.py --threads 1 --parallel 3   # seeds side by side, 1 torch thread each

The commands are the ones the README and the examples' docstrings show (COMMANDS below; tests/test_examples.py
checks that they match the docs and runs each in smoke mode). Each run writes RUN_DIR/summary.json; this reads
it: held-out pass rate before and after, and the run's own wall time (model load to the final eval).
The whole command's wall time (process start to exit) is reported too.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# name -> the documented `posttrain ...` command, exactly as written in the README / the example's docstring.
COMMANDS = {
    "custom_task": "posttrain train task.name=examples/custom_task.py:make_task loop.steps=15",
    "tool_task": "posttrain train task.name=examples/tool_task.py:make_task warm_start.steps=20 loop.steps=10",
}


def run_one(name: str, seed: int, out: Path, threads: int | None, timeout_s: float, reread: bool = False) -> dict:
    """Run one documented command (or, with `reread`, only read the summary of a run already in `out`)."""
    argv = shlex.split(COMMANDS[name])
    exe = [sys.executable, "-m", "posttrain.cli", *argv[1:]]
    run_dir = out / f"{name}_s{seed}"
    extra = [f"run.seed={seed}", f"run.output_dir={run_dir}", "logging.tensorboard=false"]
    if threads:
        extra.append(f"model.threads={threads}")
    t0, rc = time.perf_counter(), 0
    if not reread:
        with open(out / f"{name}_s{seed}.log", "w") as log:
            try:
                rc = subprocess.run(exe + extra, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                    timeout=timeout_s).returncode
            except subprocess.TimeoutExpired:  # one slow run is a row marked failed, not a lost benchmark
                rc = None
    wall = time.perf_counter() - t0
    summaries = sorted(run_dir.glob("*/summary.json"))
    if rc != 0 or not summaries:
        return {"name": name, "seed": seed, "ok": False, "wall_s": wall}
    s = json.loads(summaries[-1].read_text())
    # The command's starting point: with a warm start in the command, the model before it (the run's own
    # "before" eval comes after the warm start).
    base = (s.get("warm_start") or {}).get("base_eval") or s["before"]
    return {"name": name, "seed": seed, "ok": True, "before": base["eval/pass_rate"],
            "after_warm_start": s["before"]["eval/pass_rate"] if s.get("warm_start") else None,
            "after": s["after"]["eval/pass_rate"], "run_s": s["wall_seconds"], "wall_s": wall}


def _ms(xs: list[float], fmt: str) -> str:
    if not xs:
        return "-"
    if len(xs) == 1:
        return format(xs[0], fmt)
    return f"{format(statistics.mean(xs), fmt)} ± {format(statistics.stdev(xs), fmt.replace('+', ''))}"


def table(results: list[dict]) -> str:
    lines = ["| example | command | seeds | held-out pass before | after warm start | after | change (pts) | "
             "min..max change | run time (min) |", "|---|---|---|---|---|---|---|---|---|"]
    for name in COMMANDS:
        rs = [r for r in results if r["name"] == name and r["ok"]]
        if not rs:
            continue
        d = [100 * (r["after"] - r["before"]) for r in rs]
        warm = [100 * r["after_warm_start"] for r in rs if r.get("after_warm_start") is not None]
        lines.append(f"| {name} | `{COMMANDS[name]}` | {len(rs)} | {_ms([100 * r['before'] for r in rs], '.1f')}% | "
                     f"{_ms(warm, '.1f') + '%' if warm else 'no warm start'} | "
                     f"{_ms([100 * r['after'] for r in rs], '.1f')}% | {_ms(d, '+.1f')} | {min(d):+.1f}..{max(d):+.1f} | "
                     f"{_ms([r['run_s'] / 60 for r in rs], '.1f')} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", default=list(COMMANDS), choices=list(COMMANDS))
    ap.add_argument("--seeds", nargs="*", type=int, default=[0, 1, 2])
    ap.add_argument("--threads", type=int, default=None, help="model.threads per run (default: all cores)")
    ap.add_argument("--parallel", type=int, default=1, help="runs at once (use with --threads)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "examples")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds one run may take")
    ap.add_argument("--reread", action="store_true", help="do not run: rebuild the table from the runs in --out")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    jobs = [(n, s) for n in a.only for s in a.seeds]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=max(1, a.parallel)) as pool:
        results = list(pool.map(lambda j: run_one(j[0], j[1], a.out, a.threads, a.timeout, a.reread), jobs))
    for r in results:
        print(json.dumps(r))
    (a.out / "results.json").write_text(json.dumps(results, indent=1))
    print(table(results))


if __name__ == "__main__":
    main()
