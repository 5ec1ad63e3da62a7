"""Does a `posttrain auto` winner hold? Re-run the search's base config and its accepted best config on seeds the
search never saw, with the same per-trial budget, and compare the held-out metric.

    python bench/auto_fresh_seeds.py SEARCH_DIR [--seeds 2 3] [--jobs 2] [--out SEARCH_DIR/fresh]
                                     [--results bench/results]

Each run is `posttrain train CONFIG <the program's set: and trial budget> run.seed=S` with CONFIG the search's
base.yaml (arm "default") or best.yaml (arm "best"), run by the search's own trial runner (budget.trial.timeout_s,
a log beside the run directory), `--jobs` at a time (give the program's set: a
`model.threads` that fits: on 2 cores, 1 thread and 2 jobs). A run directory that already holds a summary.json
is reused, but only if its resolved config is the one this script would run (else it stops and says so). The
winner holds when its mean beats the default's by more than the seed spread (max - min) of either arm on the
fresh seeds, and never by less than the program's `noise:` floor. Writes
RESULTS/auto_fresh_seeds.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from posttrain.auto.program import Program, load_program
from posttrain.auto.runner import SubprocessRunner, TrialSpec, read_metric
from posttrain.config.load import load_config

RESULTS = Path(__file__).resolve().parent / "results"


def arm_configs(search_dir: Path) -> dict[str, Path]:
    """The two configs to compare: the base config and the accepted best one."""
    state = json.loads((search_dir / "search_state.json").read_text())
    inc = state.get("incumbent") or {}
    if not inc:
        raise SystemExit(f"{search_dir}: the search has no incumbent yet (did its baseline finish?)")
    if inc.get("trial") == 0:
        raise SystemExit(f"{search_dir}: no candidate was accepted (the incumbent is the base config): "
                         "nothing to check")
    base, best = search_dir / "base.yaml", search_dir / "best.yaml"
    for p in (base, best):
        if not p.exists():
            raise SystemExit(f"{p} is missing (a search started without a base config, or not finished)")
    return {"default": base, "best": best}


# The trial command, as `posttrain auto` runs it (None: python -m posttrain.cli train); the tests swap in a fake.
TRAIN_COMMAND: list[str] | None = None


def spec(prog: Program, out: Path, arm: str, seed: int) -> TrialSpec:
    """One fresh-seed run as a search trial: the program's set: and budget, its timeout, a log beside the run."""
    name = f"{arm}-s{seed}"
    return TrialSpec(name, prog.trial_overrides(), seed, prog.timeout_s, out, out / f"{name}.log")


def same_config(run_dir: Path, config: Path, ovs: list[str]) -> bool:
    """Whether a finished run was run with what this script would run now (run.* aside)."""
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    want = load_config(config, ovs).model_dump(mode="json")
    for d in (saved, want):
        d.pop("run", None)
    return saved == want


def run_one(config: Path, sp: TrialSpec, metric: str) -> dict:
    """Reuse a finished run with the same config, else run it through the search's own trial runner (its
    timeout, process-group kill and metric reading)."""
    if (sp.run_dir / "summary.json").exists():
        if not same_config(sp.run_dir, config, sp.overrides):
            raise SystemExit(f"{sp.run_dir} holds a finished run with a different config: remove it or pick --out")
        return {"value": read_metric(sp.run_dir, metric), "reused": True, "wall_s": None}
    o = SubprocessRunner(metric, config, command=TRAIN_COMMAND)(sp)
    if o.status != "ok":
        print(f"  {sp.name}: {o.status}: {o.error} (log {sp.log_path})", flush=True)
    return {"value": o.value, "reused": False, "wall_s": o.wall_s, "error": o.error}


def verdict(arms: dict[str, list[float]], direction: str, floor: float) -> dict:
    """Pure: the winner holds when it beats the default by more than either arm's seed spread (and the floor)."""
    means = {a: statistics.fmean(v) for a, v in arms.items()}
    spreads = {a: max(v) - min(v) for a, v in arms.items()}
    margin = means["best"] - means["default"] if direction == "max" else means["default"] - means["best"]
    noise = max(floor, *spreads.values())
    return {"means": means, "spreads": spreads, "margin": margin, "noise": noise, "holds": margin > noise}


def table(prog: Program, seeds: list[int], arms: dict[str, list[float]], v: dict, search_dir: Path) -> str:
    lines = [f"posttrain auto winner on fresh seeds: {search_dir.name}, {prog.metric} ({prog.direction}), "
             f"seeds {seeds}, the program's trial budget ({prog.steps} steps)", "",
             "| arm | " + " | ".join(f"seed {s}" for s in seeds) + " | mean | spread |",
             "|---|" + "---:|" * (len(seeds) + 2)]
    for a, vals in arms.items():
        lines.append(f"| {a} | " + " | ".join(f"{x:.3f}" for x in vals)
                     + f" | {v['means'][a]:.3f} | {v['spreads'][a]:.3f} |")
    lines += ["", f"best - default: {v['margin']:+.3f}; needed > {v['noise']:.3f} (the larger seed spread, floor "
                  f"{prog.noise:g}): **{'holds' if v['holds'] else 'does not hold'}**"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("search_dir", type=Path)
    ap.add_argument("--seeds", type=int, nargs="+", default=[2, 3])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--results", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    d = args.search_dir.resolve()
    prog = load_program(d / "program.md", d / "base.yaml" if (d / "base.yaml").exists() else None)
    used = set(prog.seeds) & set(args.seeds)
    if used:
        raise SystemExit(f"seeds {sorted(used)} are the search's own seeds: pick fresh ones")
    configs = arm_configs(d)
    out = (args.out or d / "fresh").resolve()
    out.mkdir(parents=True, exist_ok=True)
    jobs = [(a, s) for a in configs for s in args.seeds]
    print(f"{len(jobs)} runs, {args.jobs} at a time, into {out}", flush=True)
    with ThreadPoolExecutor(args.jobs) as pool:
        res = dict(zip(jobs, pool.map(lambda j: run_one(configs[j[0]], spec(prog, out, *j), prog.metric), jobs)))
    for (a, s), r in res.items():
        how = "reused" if r["reused"] else f"{r['wall_s']:.0f}s"
        print(f"  {a}-s{s}: {prog.metric}={r['value']} [{how}]", flush=True)
    if any(r["value"] is None for r in res.values()):
        raise SystemExit("some runs have no metric (logs beside their run directories)")
    arms = {a: [res[(a, s)]["value"] for s in args.seeds] for a in configs}
    v = verdict(arms, prog.direction, prog.noise)
    md = table(prog, args.seeds, arms, v, d)
    print(md)
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "auto_fresh_seeds.md").write_text(md)
    (args.results / "auto_fresh_seeds.json").write_text(json.dumps(
        {"search_dir": str(d), "metric": prog.metric, "seeds": args.seeds, "arms": arms, **v,
         "best_diff": json.loads((d / "search_state.json").read_text())["incumbent"]["params"]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
