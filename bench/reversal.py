"""REVERSAL-BENCH cliff table: a scripted policy (no LLM) over rho x {episodic, reset_free} x {shield off, on}.

rho is reversibility (1 = every move can be undone, 0 = about 40% of off-path cells are pits or one-way doors).
Episodic: n_goals episodes per map with a reset between them; reset-free: one life per map over n_goals goals.
success: episodic, share of episodes that reached the goal; reset-free, goals reached / n_goals.
absorbed: share of episodes (lives) that entered a state from which the goal was unreachable (per the oracle).
Shield precision/recall are measured against the oracle in both shield settings (off: in the shadow).
Writes bench/results/reversal.{json,md}.

    python bench/reversal.py                        # greedy, 200 maps, size 6
    python bench/reversal.py --policy random --maps 100 --size 5
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from posttrain.tasks.reversal.baselines import POLICIES, run_config

OUT = Path(__file__).parent / "results"


def _fmt(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", choices=sorted(POLICIES), default="greedy")
    ap.add_argument("--maps", type=int, default=200)
    ap.add_argument("--size", type=int, default=6)
    ap.add_argument("--goals", type=int, default=3)
    ap.add_argument("--rho", type=float, nargs="+", default=[0.0, 0.5, 1.0])
    ap.add_argument("--no-write", action="store_true", help="print only")
    a = ap.parse_args()
    seeds = list(range(a.maps))
    rows = []
    for rho in a.rho:
        for mode in ("episodic", "reset_free"):
            for shield in ("off", "on"):
                m = run_config(a.policy, seeds, a.size, rho, mode, shield, n_goals=a.goals)
                rows.append({"rho": rho, "mode": mode, "shield": shield, **m})
    head = "| rho | mode | shield | success | absorbed | vetoes/ep | shield precision | shield recall |"
    lines = [f"policy={a.policy} maps={a.maps} size={a.size} goals={a.goals}", "", head,
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['rho']:.1f} | {r['mode']} | {r['shield']} | {r['success']:.2f} | {r['absorbed']:.2f} | "
                     f"{r['vetoes']:.1f} | {_fmt(r['shield_precision'])} | {_fmt(r['shield_recall'])} |")
    table = "\n".join(lines)
    print(table)
    if not a.no_write:
        OUT.mkdir(exist_ok=True)
        (OUT / "reversal.json").write_text(json.dumps({"args": vars(a), "rows": rows}, indent=1))
        (OUT / "reversal.md").write_text(table + "\n")


if __name__ == "__main__":
    main()
