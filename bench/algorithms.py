"""Every algorithm on the same wall-clock budget: which one learns fastest on this machine?

Each variant (advantage estimator x policy loss, DAPO, ES) trains the default model on two built-in tasks
(`json-extract`, and `count-a`: raise the share of the letter 'a' in a short reply) for the same training-time
budget (`loop.time_budget_s`; the final held-out eval is outside it), with 3 seeds. Every run is a separate
`posttrain train` process (this script only launches runs and reads their run directories), `--jobs 2` runs two
at a time with one thread each, so all variants see the same conditions.

    python bench/algorithms.py [--budget-json 75] [--budget-count 40] [--seeds 0 1 2] [--jobs 2]
                               [--variants grpo cispo ...] [--tasks json-extract count-a] [--model default]

Per run it records: the held-out pass rate after training (greedy), the training reward at 25/50/75/100% of the
budget (mean of the steps that ended in that quarter), seconds per step and steps done. The base model's
held-out pass rate is measured once per task (a 0-step run). Writes bench/results/algorithms.{json,md} and
algorithms.png (reward vs wall time, mean over seeds).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"

# name -> config overrides. Estimators are compared under the same loss (ppo_clip), losses under the same
# estimator (grpo); DAPO and ES are whole recipes.
VARIANTS: dict[str, list[str]] = {
    "grpo": ["algorithm.name=grpo"],
    "dr_grpo": ["algorithm.name=dr_grpo"],
    "rloo": ["algorithm.name=rloo"],
    "reinforce_pp": ["algorithm.name=reinforce_pp"],
    "grpo+reinforce": ["algorithm.name=grpo", "algorithm.loss=reinforce"],
    "cispo": ["algorithm.name=cispo"],
    "gspo": ["algorithm.name=gspo"],
    "dapo": ["algorithm.name=dapo"],
    "es": ["algorithm.name=es", "algorithm.es.population=8"],
}
TASKS: dict[str, list[str]] = {
    "json-extract": ["task.name=json-extract", "trainer.lr=2e-5", "loop.eval_prompts=32"],
    "count-a": ["task.name=count-a", "trainer.lr=5e-5", "loop.eval_prompts=32"],
}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--budget-json", type=float, default=75.0, help="training seconds per json-extract run")
    p.add_argument("--budget-count", type=float, default=40.0, help="training seconds per count-a run")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--jobs", type=int, default=2, help="runs at a time (threads per run = cores / jobs)")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    p.add_argument("--model", default="default")
    p.add_argument("--out-dir", default=str(ROOT / "runs" / "bench-algorithms"))
    p.add_argument("--results", default=str(RESULTS))
    p.add_argument("--reuse", action="store_true", help="read finished runs from --out-dir instead of re-running them")
    p.add_argument("--merge", action="store_true",
                   help="re-run only these variants/tasks and merge into the existing algorithms.json")
    return p.parse_args(argv)


def run_one(args, task: str, variant: str | None, seed: int, threads: int) -> dict:
    budget = args.budget_json if task == "json-extract" else args.budget_count
    name = f"{task}-{variant or 'base'}-s{seed}"
    over = TASKS[task] + (VARIANTS[variant] if variant else []) + [
        f"model.name={args.model}", f"model.threads={threads}", f"run.seed={seed}", f"run.output_dir={args.out_dir}",
        f"run.name={name}", "logging.tensorboard=false", "loop.save_every=0", "loop.samples_per_step=0"]
    if variant:
        over += ["loop.eval_before=false", "loop.steps=100000", f"loop.time_budget_s={budget}"]
    else:
        over += ["loop.steps=0"]
    run_dir = Path(args.out_dir) / name
    t0 = time.perf_counter()
    if args.reuse and (run_dir / "summary.json").exists():
        wall = float("nan")  # measured when it ran; its metrics are read back below
    else:
        shutil.rmtree(run_dir, ignore_errors=True)
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}
        proc = subprocess.run([sys.executable, "-m", "posttrain.cli", "train", *over], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=budget * 6 + 600)
        wall = time.perf_counter() - t0
        # Weights are not needed here and a full fine-tune's checkpoint + final model take ~2 GB per run.
        shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
        shutil.rmtree(run_dir / "final", ignore_errors=True)
        if proc.returncode != 0:
            print(f"  {name}: FAILED\n{proc.stderr[-2000:]}", flush=True)
            return {"task": task, "variant": variant, "seed": seed, "error": proc.stderr[-2000:]}
    summary = json.loads((run_dir / "summary.json").read_text())
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    train = [r for r in recs if r.get("kind") == "train"]
    t, curve = 0.0, []
    for r in train:
        t += r.get("time/step", 0.0)
        # task reward: DAPO's soft overlong penalty is reward shaping, not task success, so it is taken out
        curve.append((t, r.get("reward/mean", 0.0) - r.get("dapo/overlong_penalty_mean", 0.0)))
    ev = summary["after"] if variant else summary["before"]
    out = {"task": task, "variant": variant or "base", "seed": seed, "budget_s": budget, "steps": len(train),
           "pass_rate": ev.get("eval/pass_rate"), "eval_reward": ev.get("eval/reward/mean"), "curve": curve,
           "s_per_step": statistics.median(r.get("time/step", 0.0) for r in train) if train else None,
           "process_wall_s": wall}
    for q in (0.25, 0.5, 0.75, 1.0):
        lo, hi = budget * (q - 0.25), budget * q
        win = [rw for tt, rw in curve if lo < tt <= hi] or [rw for tt, rw in curve if tt <= hi][-1:]
        out[f"reward@{int(q * 100)}%"] = statistics.fmean(win) if win else None
    print(f"  {name}: steps={out['steps']} pass={out['pass_rate']:.3f} reward@100%={out['reward@100%']} "
          f"s/step={out['s_per_step']} [{wall:.0f}s]" if variant else f"  {name}: base pass={out['pass_rate']:.3f}",
          flush=True)
    return out


def _ms(vals: list[float]) -> str:
    vals = [v for v in vals if v is not None]
    if not vals:
        return "-"
    return f"{statistics.fmean(vals):.3f} ± {statistics.stdev(vals):.3f}" if len(vals) > 1 else f"{vals[0]:.3f}"


def table(results: list[dict], tasks: list[str], variants: list[str]) -> str:
    lines = []
    for task in tasks:
        rs = [r for r in results if r["task"] == task and "error" not in r]
        base = [r for r in rs if r["variant"] == "base"]
        b = base[0]["pass_rate"] if base else None
        br = base[0]["eval_reward"] if base else None
        budget = max((r["budget_s"] for r in rs), default=0)
        lines += [f"### {task} ({budget:.0f} s of training per run; base model held-out pass rate "
                  f"{b * 100:.1f}%, held-out reward {br:.3f})" if b is not None else f"### {task}", "",
                  "| variant | held-out pass after | held-out reward after | train reward @25% | @50% | @75% | @100% "
                  "| s/step | steps |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for v in variants:
            vr = [r for r in rs if r["variant"] == v]
            if not vr:
                continue
            lines.append(f"| {v} | {_ms([r['pass_rate'] for r in vr])} | {_ms([r['eval_reward'] for r in vr])} | "
                         + " | ".join(
                _ms([r[f'reward@{q}%'] for r in vr]) for q in (25, 50, 75, 100)) +
                f" | {statistics.median(r['s_per_step'] for r in vr if r['s_per_step']):.1f} | "
                f"{statistics.fmean(r['steps'] for r in vr):.1f} |")
        lines.append("")
    return "\n".join(lines)


def plot(results: list[dict], tasks: list[str], variants: list[str], path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no PNG", flush=True)
        return
    fig, axes = plt.subplots(1, len(tasks), figsize=(7 * len(tasks), 4.5), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for v in variants:
            vr = [r for r in results if r["task"] == task and r["variant"] == v and "error" not in r]
            if not vr:
                continue
            budget = vr[0]["budget_s"]
            grid = [budget * i / 20 for i in range(1, 21)]
            ys = []
            for t in grid:  # per seed: mean reward of steps ended in the last 20% of the budget before t
                per_seed = [statistics.fmean(w) for r in vr
                            if (w := [rw for tt, rw in r["curve"] if t - budget * 0.2 < tt <= t])]
                ys.append(statistics.fmean(per_seed) if per_seed else float("nan"))
            ax.plot(grid, ys, label=v, linestyle="--" if v in ("es", "dapo") else "-")
        ax.set_title(task)
        ax.set_xlabel("training wall time (s)")
        ax.set_ylabel("train reward (mean over seeds, 20%-window)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}", flush=True)


def main(argv=None) -> None:
    args = parse_args(argv)
    threads = max(1, (os.cpu_count() or 2) // args.jobs)
    out = Path(args.results)
    old: list[dict] = []
    if args.merge and (out / "algorithms.json").exists():
        old = json.loads((out / "algorithms.json").read_text())["results"]
    have_base = {r["task"] for r in old if r["variant"] == "base" and "error" not in r}
    jobs = [(t, None, 0) for t in args.tasks if t not in have_base] + [
        (t, v, s) for t in args.tasks for v in args.variants for s in args.seeds]
    print(f"{len(jobs)} runs, {args.jobs} at a time, {threads} thread(s) each", flush=True)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(lambda j: run_one(args, *j, threads), jobs))
    print(f"all runs done in {(time.perf_counter() - t0) / 60:.1f} min", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    if old:
        redone = {(r["task"], r["variant"], r["seed"]) for r in results}
        results = [r for r in old if (r["task"], r["variant"], r["seed"]) not in redone] + results
        args.tasks = [t for t in TASKS if any(r["task"] == t for r in results)]
        args.variants = [v for v in VARIANTS if any(r["variant"] == v for r in results)]
    md = table(results, args.tasks, args.variants)
    print(md, flush=True)
    (out / "algorithms.json").write_text(json.dumps({"args": vars(args), "results": results}, indent=1))
    (out / "algorithms.md").write_text("# bench/algorithms.py\n\n" + md)
    plot(results, args.tasks, args.variants, out / "algorithms.png")


if __name__ == "__main__":
    main()
