"""Diagnostics and remedies on the stall tasks: the Run watches its metrics and applies remedies itself.

For each seed it trains the `partial_credit` stall task twice, remedies off and on, and reports the held-out
headline pass rate and when each diagnostic fired.

    python bench/remedy_stall.py [--task partial_credit] [--steps 30] [--seeds 0 1 2] [--out bench/results]

Writes bench/results/remedy_{task}.{json,md}; each run dir holds metrics.jsonl with the diagnostic and remedy
records (`posttrain diagnose RUN_DIR`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from posttrain.config import load_config
from posttrain.loop import train

ROOT = Path(__file__).resolve().parents[1]


def run_one(task: str, steps: int, seed: int, remedies: bool, out: Path, extra: list[str], variant: str = "") -> dict:
    name = f"{task}-s{seed}-{'remedies' if remedies else 'plain'}{'-' + variant if variant else ''}"
    cfg = load_config(None, [f"task.name={ROOT}/examples/stall_tasks.py:{task}", f"loop.steps={steps}",
                             f"run.seed={seed}", f"run.name={name}", f"run.output_dir={out}", "loop.save_every=0",
                             "logging.tensorboard=false", f"diagnostics.remedies.enabled={str(remedies).lower()}",
                             *extra])
    res = train(cfg)
    summary = json.loads((res.run_dir / "summary.json").read_text())
    return {"run": name, "seed": seed, "remedies": remedies, "variant": variant, "overrides": extra,
            "steps": steps, "before": res.before.get("eval/pass_rate"),
            "after": res.after.get("eval/pass_rate"), "reward_after": res.after.get("eval/reward/mean"),
            "diagnostics": [(d["name"], d["start_step"], d["end_step"]) for d in summary["diagnostics"]],
            "run_dir": str(res.run_dir)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--task", default="partial_credit")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--modes", nargs="+", default=["plain", "remedies"])
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "remedy_runs"))
    ap.add_argument("--variant", default="", help="a name for these overrides (kept in the run name and the table)")
    ap.add_argument("extra", nargs="*", help="config overrides for every run")
    a = ap.parse_args()
    rows = []
    for seed in a.seeds:
        for mode in a.modes:
            rows.append(run_one(a.task, a.steps, seed, mode == "remedies", Path(a.out), a.extra, a.variant))
            print(json.dumps(rows[-1]), flush=True)
    res = ROOT / "bench" / "results"
    # Merge with earlier rows (by run name), so seeds and modes can run in separate processes side by side.
    path = res / f"remedy_{a.task}.json"
    old = [r for r in (json.loads(path.read_text()) if path.exists() else []) if r["run"] not in {x["run"] for x in rows}]
    rows = sorted(old + rows, key=lambda r: (r.get("variant", ""), r["seed"], r["remedies"]))
    path.write_text(json.dumps(rows, indent=2))
    lines = ["| seed | remedies | overrides | held-out pass before | after | diagnostics (name: start-end step) |",
             "|---|---|---|---:|---:|---|"]
    for r in rows:
        diags = ", ".join(f"{n}: {s}-{e if e is not None else ''}" for n, s, e in r["diagnostics"]) or "none"
        over = " ".join(r.get("overrides", [])) or "-"
        lines.append(f"| {r['seed']} | {'on' if r['remedies'] else 'off'} | `{over}` | {r['before']:.1%} | {r['after']:.1%} | "
                     f"{diags} |")
    (res / f"remedy_{a.task}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
