"""Does RL raise the drawing task's held-out gated reward after the warm start? A table from finished runs.

    python bench/drawing_rl.py RUN_DIR [RUN_DIR ...] [--out bench/results/drawing_rl]

Each RUN_DIR is a drawing run that starts from a warm-started model: `warm_start.steps=N` in the run, or
`model.name=` a warm-started folder (the commands are in docs/drawing.md). Its evals are read from metrics.jsonl:
step 0 is the model RL starts from, later steps are RL. Printed per run and eval: the gated reward (the mean
reward: gate, length and image score, 0 for a refused program), the mean image score, the share of programs
through the gate and the share passing (image score >= 0.5); then per arm (the run name without its `-sN` seed
suffix, or `--arm RUN=ARM`) the change from step 0 to the last eval, per seed, with the mean and range. Writes
OUT.json and OUT.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import yaml

RESULTS = Path(__file__).resolve().parent / "results"
# what each column reads from an eval record (the first key present wins)
COLUMNS = {
    "gated reward": ("eval/reward/mean",),
    "image score": ("eval/reward/drawing_image",),
    "through the gate": ("eval/drawing/gate_pass_rate",),
    "passing": ("eval/pass_rate",),
}


def _get(rec: dict, keys: tuple[str, ...]) -> float | None:
    return next((float(rec[k]) for k in keys if k in rec), None)


def read_run(run_dir: Path) -> dict:
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    evals = [r for r in recs if r.get("kind") == "eval"]
    if not evals:
        raise SystemExit(f"{run_dir}: no held-out eval in metrics.jsonl (a run still in its warm start?)")
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    return {"run": run_dir.name, "seed": cfg.get("run", {}).get("seed"),
            "steps": max(r["step"] for r in recs if r.get("kind") == "train") if any(
                r.get("kind") == "train" for r in recs) else 0,
            "lr": cfg["trainer"]["lr"], "beta": cfg["algorithm"]["beta"],
            "evals": [{"step": r["step"], **{c: _get(r, k) for c, k in COLUMNS.items()}} for r in evals]}


def arm_of(run: dict, arms: dict[str, str]) -> str:
    return arms.get(run["run"]) or run["run"].rsplit("-s", 1)[0]


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def table(runs: list[dict], arms: dict[str, str]) -> str:
    lines = ["| run | seed | eval step | " + " | ".join(COLUMNS) + " |", "|---|---:|---:|" + "---:|" * len(COLUMNS)]
    for r in runs:
        for e in r["evals"]:
            lines.append(f"| {r['run']} | {r['seed']} | {e['step']} | " + " | ".join(_f(e[c]) for c in COLUMNS) + " |")
    lines += ["", "| arm | gated reward, warm start -> last eval, per seed | change, mean (min..max) | rose on |",
              "|---|---|---:|---:|"]
    by_arm: dict[str, list[dict]] = {}
    for r in runs:
        by_arm.setdefault(arm_of(r, arms), []).append(r)
    for arm, rs in by_arm.items():
        pairs = [(r["evals"][0]["gated reward"], r["evals"][-1]["gated reward"], r["seed"]) for r in rs
                 if r["evals"][0]["step"] == 0 and len(r["evals"]) > 1]
        if not pairs:
            continue
        deltas = [b - a for a, b, _ in pairs]
        per_seed = ", ".join(f"s{s}: {a:.3f} -> {b:.3f}" for a, b, s in pairs)
        lines.append(f"| {arm} | {per_seed} | {statistics.fmean(deltas):+.3f} ({min(deltas):+.3f}..{max(deltas):+.3f})"
                     f" | {sum(d > 0 for d in deltas)} of {len(deltas)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--arm", action="append", default=[], metavar="RUN=ARM",
                   help="name a run's arm (default: the run name without its -sN suffix)")
    p.add_argument("--out", type=Path, default=RESULTS / "drawing_rl")
    args = p.parse_args(argv)
    missing = [str(r) for r in args.runs if not (r / "metrics.jsonl").exists()]
    if missing:
        sys.exit(f"not a run dir (no metrics.jsonl): {', '.join(missing)}")
    arms = dict(a.split("=", 1) for a in args.arm)
    runs = [read_run(r) for r in args.runs]
    md = table(runs, arms)
    print(md)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(runs, indent=1))
    args.out.with_suffix(".md").write_text("# bench/drawing_rl.py\n\n" + md + "\n")


if __name__ == "__main__":
    main()
