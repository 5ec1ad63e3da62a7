"""Old defaults vs new defaults: the same commands, seeds side by side, held-out headline before and after.

    python bench/defaults.py                                   # every case, seeds 0 1 2, old and new
    python bench/defaults.py --only demo --seeds 0 1 2 --threads 1 --parallel 2
    python bench/defaults.py --reread                          # rebuild the table from the runs already done

What the two sets are (`DEFAULTS` below, written out in full so this script means the same whatever the
defaults are; "new" is the candidate set that was measured, not necessarily today's defaults): how each step's prompts are drawn (`loop.prompt_selection`: uniform, or adaptive, which replays
the prompts the policy sometimes fails, retires mastered ones and backs off hopeless ones;
algos/prompt_selection.py) and whether stall remedies act (`diagnostics.remedies.enabled`).

Each case is a documented command (the demo, the README's examples and stall tasks, a built-in task) run once per
seed and per set of defaults. Every run writes RUN_DIR/summary.json; this reads the held-out pass rate of the
command's starting model, after its warm start (if it has one) and after RL, and the run's wall time. Results are
appended to OUT/results.jsonl as each run ends (a crash loses only the runs in flight, and a rerun skips the ones
done), then summarised: mean, spread (std, min..max) and the new - old difference of the means, with the seeds'
spread beside it to say whether a difference is inside the noise. Writes bench/results/defaults.md.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from examples import _ms as _mean_std  # noqa: E402 - mean ± std, as the examples table prints it


def _ms(xs: list[float], fmt: str = ".1f") -> str:
    return _mean_std(xs, fmt)

# name -> the command (as documented), run with each DEFAULTS set appended.
CASES = {
    "demo": "posttrain train configs/demo.yaml",
    "json_extract_rl": "posttrain train loop.steps=20",
    "custom_task": "posttrain train task.name=examples/custom_task.py:make_task loop.steps=15",
    "partial_credit": "posttrain train task.name=examples/stall_tasks.py:partial_credit loop.steps=30",
}
DEFAULTS = {
    "old": ["loop.prompt_selection=uniform", "diagnostics.remedies.enabled=false"],
    "new": ["loop.prompt_selection=adaptive", "diagnostics.remedies.enabled=true"],
}


def run_one(case: str, which: str, seed: int, out: Path, threads: int | None, timeout_s: float) -> dict:
    argv = shlex.split(CASES[case])
    run_dir = out / f"{case}_{which}_s{seed}"
    # no checkpoints: nothing resumes here, and 24 runs of the default model would fill a disk with them
    extra = [*DEFAULTS[which], f"run.seed={seed}", f"run.output_dir={run_dir}", "logging.tensorboard=false",
             "loop.keep_checkpoints=0"]
    if threads:
        extra.append(f"model.threads={threads}")
    t0, rc = time.perf_counter(), 0
    with open(out / f"{case}_{which}_s{seed}.log", "w") as log:
        try:
            rc = subprocess.run([sys.executable, "-m", "posttrain.cli", *argv[1:], *extra], cwd=ROOT, stdout=log,
                                stderr=subprocess.STDOUT, timeout=timeout_s).returncode
        except subprocess.TimeoutExpired:  # one slow run is a row marked failed, not a lost benchmark
            rc = None
    return summarize(case, which, seed, run_dir, rc, time.perf_counter() - t0)


def summarize(case: str, which: str, seed: int, run_dir: Path, rc: int | None, wall: float) -> dict:
    summaries = sorted(run_dir.glob("*/summary.json"))
    row = {"case": case, "defaults": which, "seed": seed, "wall_s": round(wall, 1)}
    if rc != 0 or not summaries:
        return {**row, "ok": False, "rc": rc}
    s = json.loads(summaries[-1].read_text())
    base = (s.get("warm_start") or {}).get("base_eval") or s["before"]
    m = [json.loads(x) for x in (summaries[-1].parent / "metrics.jsonl").read_text().splitlines() if x.strip()]
    train = [r for r in m if r.get("kind") == "train"]
    return {**row, "ok": True, "before": base["eval/pass_rate"],
            "after_warm_start": s["before"]["eval/pass_rate"] if s.get("warm_start") else None,
            "after": s["after"]["eval/pass_rate"], "run_s": s["wall_seconds"],
            # steps where every sample passed (nothing to learn) and remedy actions taken
            "saturated_steps": sum(1 for r in train if r.get("pass_rate", 0) >= 1.0),
            "remedy_events": sum(1 for r in m if r.get("kind") == "remedy")}


def table(results: list[dict]) -> str:
    lines = ["| case | defaults | seeds | held-out before | after warm start | after | RL's share (pts) | "
             "min..max after | steps all passed | remedy actions | run time (min) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    verdicts = []
    for case in CASES:
        means = {}
        for which in DEFAULTS:
            rs = [r for r in results if r["case"] == case and r["defaults"] == which and r["ok"]]
            failed = sum(1 for r in results if r["case"] == case and r["defaults"] == which and not r["ok"])
            if not rs:
                continue
            after = [100 * r["after"] for r in rs]
            start = [100 * (r["after_warm_start"] if r["after_warm_start"] is not None else r["before"]) for r in rs]
            warm = [100 * r["after_warm_start"] for r in rs if r["after_warm_start"] is not None]
            means[which] = (statistics.mean(after), (max(after) - min(after)) if len(after) > 1 else 0.0)
            lines.append(
                f"| {case} | {which} | {','.join(str(r['seed']) for r in rs)}{f' ({failed} failed)' if failed else ''}"
                f" | {_ms([100 * r['before'] for r in rs])}% | {_ms(warm) + '%' if warm else 'none'} | "
                f"{_ms(after)}% | {_ms([a - b for a, b in zip(after, start)], '+.1f')} | "
                f"{min(after):.1f}..{max(after):.1f} | {_ms([r['saturated_steps'] for r in rs])} | "
                f"{_ms([r['remedy_events'] for r in rs])} | {_ms([r['run_s'] / 60 for r in rs])} |")
        if len(means) == 2:
            d = means["new"][0] - means["old"][0]
            noise = max(means["new"][1], means["old"][1])
            verdicts.append(f"- {case}: new - old = {d:+.1f} points on the mean; seed spread (max-min) up to "
                            f"{noise:.1f}: {'inside the noise' if abs(d) <= noise else ('better' if d > 0 else 'WORSE')}")
    return "\n".join(lines + [""] + verdicts)


def load(out: Path) -> list[dict]:
    path = out / "results.jsonl"
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", default=list(CASES), choices=list(CASES))
    ap.add_argument("--defaults", nargs="*", default=list(DEFAULTS), choices=list(DEFAULTS))
    ap.add_argument("--seeds", nargs="*", type=int, default=[0, 1, 2])
    ap.add_argument("--threads", type=int, default=None, help="model.threads per run (default: all cores)")
    ap.add_argument("--parallel", type=int, default=1, help="runs at once (use with --threads)")
    ap.add_argument("--out", type=Path, default=Path("/tmp/posttrain_defaults"))
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds one run may take")
    ap.add_argument("--reread", action="store_true", help="do not run: the table from --out/results.jsonl")
    ap.add_argument("--results", type=Path, default=ROOT / "bench" / "results" / "defaults.md")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    done = {(r["case"], r["defaults"], r["seed"]) for r in load(a.out) if r["ok"]}
    jobs = [(c, w, s) for c in a.only for s in a.seeds for w in a.defaults if (c, w, s) not in done]
    if not a.reread:
        print(f"{len(jobs)} runs to do ({len(done)} already in {a.out}/results.jsonl)", flush=True)

        def job(j):
            r = run_one(*j, a.out, a.threads, a.timeout)
            with open(a.out / "results.jsonl", "a") as f:
                f.write(json.dumps(r) + "\n")
            print(json.dumps(r), flush=True)
            return r

        with ThreadPoolExecutor(max_workers=max(1, a.parallel)) as pool:
            list(pool.map(job, jobs))
    results = [r for r in load(a.out) if r["case"] in a.only]
    cmd = "python bench/defaults.py " + " ".join(sys.argv[1:])
    md = (f"# Old vs new defaults\n\n- command: `{cmd.strip()}`\n- date: {time.strftime('%Y-%m-%d %H:%M')}\n"
          f"- old: `{' '.join(DEFAULTS['old'])}`; new: `{' '.join(DEFAULTS['new'])}`\n"
          f"- held-out pass rate (the task's headline), greedy; RL's share = after - after the warm start (or - "
          f"before, without one)\n\n{table(results)}\n")
    print(md)
    a.results.parent.mkdir(parents=True, exist_ok=True)
    a.results.write_text(md)


if __name__ == "__main__":
    main()
