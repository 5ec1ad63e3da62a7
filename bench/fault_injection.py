"""Runs that lose samples on purpose: a seeded 10% of rollouts raise (`debug.rollout_fault_rate`), and the run
must finish every step with the failures counted, never abort (failure isolation, envs/isolate.py).

    python bench/fault_injection.py                    # feature-deletion 10 GRPO steps, coding-agent 4 steps
    python bench/fault_injection.py --only coding-agent --rate 0.1 --seed 0

Each run is the real `posttrain train` on the default model with the sandbox grading out of process; the
settings keep a step to a minute or two on 2 CPU cores (2 prompts x G=4 for feature-deletion, 1 x 4 for the
coding agent, short completions, a 2-prompt final eval). Reads each run's metrics.jsonl and writes
bench/results/fault_injection.{json,md}: steps finished, samples, failed samples by cause, minutes.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"

RUNS: dict[str, list[str]] = {
    "feature-deletion": ["task.name=feature-deletion", "loop.steps=10", "loop.prompts_per_step=2",
                         "algorithm.num_generations=4", "task.options.max_tokens=192"],
    "coding-agent": ["task.name=coding-agent", "loop.steps=4", "loop.prompts_per_step=1",
                     "algorithm.num_generations=4", "task.options.max_turns=4", "task.options.max_tokens=160"],
}
COMMON = ["loop.eval_before=false", "loop.eval_prompts=2", "loop.save_every=0", "model.threads=1"]


def run(name: str, rate: float, seed: int, out: Path, summarize_only: bool = False) -> dict:
    args = [*RUNS[name], *COMMON, f"debug.rollout_fault_rate={rate}", f"run.seed={seed}",
            f"run.output_dir={out}", f"run.name={name}"]
    cmd = [sys.executable, "-m", "posttrain.cli", "train", *args]
    minutes, rc = None, None
    if not summarize_only:
        print("$ posttrain train " + " ".join(args), flush=True)
        t0 = time.time()
        rc = subprocess.run(cmd, cwd=ROOT, text=True).returncode
        minutes = round((time.time() - t0) / 60, 1)
    recs = [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines() if line.strip()]
    train = [r for r in recs if r.get("kind") == "train"]

    def total(key: str) -> float:
        return sum(float(r.get(key, 0.0)) for r in train)

    return {"task": name, "exit_code": rc, "steps_wanted": int(RUNS[name][1].split("=")[1]),
            "steps_finished": len(train), "rate": rate, "seed": seed, "minutes": minutes,
            "step_minutes": round(total("time/step") / 60, 1), "samples": int(total("rollouts/count")),
            "failed_rollout": int(total("rollout/failed_rollout")), "failed_score": int(total("rollout/failed_score")),
            "failed_frac_per_step": [round(float(r.get("rollout/failed_frac", 0.0)), 3) for r in train],
            "command": "posttrain train " + " ".join(args)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=sorted(RUNS), action="append")
    ap.add_argument("--rate", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("/tmp/posttrain-fault-runs"))
    ap.add_argument("--summarize-only", action="store_true",
                    help="read the run dirs under --out without running (e.g. runs started in parallel)")
    a = ap.parse_args()
    rows = [run(n, a.rate, a.seed, a.out, a.summarize_only) for n in (a.only or list(RUNS))]
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / "fault_injection.json"
    # rows of tasks not run this time are kept, so the two runs can be made apart (or at once, in two processes)
    kept = [r for r in (json.loads(path.read_text()) if path.exists() else []) if r["task"] not in {x["task"] for x in rows}]
    rows = sorted(kept + rows, key=lambda r: list(RUNS).index(r["task"]))
    path.write_text(json.dumps(rows, indent=1) + "\n")
    lines = ["| task | steps finished | samples | failed rollouts (injected) | failed scoring | failed share per step | "
             "exit code | minutes (wall / in steps) |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['task']} | {r['steps_finished']} / {r['steps_wanted']} | {r['samples']} | "
                     f"{r['failed_rollout']} | {r['failed_score']} | "
                     f"{', '.join(f'{x:.2f}' for x in r['failed_frac_per_step'])} | {r['exit_code']} | "
                     f"{r['minutes']} / {r['step_minutes']} |")
    lines += ["", "Commands:", ""] + [f"    {r['command']}" for r in rows]
    (RESULTS / "fault_injection.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
