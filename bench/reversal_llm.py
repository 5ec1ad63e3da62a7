"""REVERSAL-BENCH cliff table for an LLM policy: held-out success over rho x {episodic, reset_free} x {shield off,
on}, played greedily through the `reversal` task's text adapter (the same env training uses).

    python bench/reversal_llm.py --model runs/REV/final                 # a trained policy, 16 held-out maps a cell
    python bench/reversal_llm.py --model default --maps 8 --rho 0.5      # the base model
    python bench/reversal_llm.py --model runs/REV/final --name after --size 5 --max-turns 10 --max-tokens 8

Per cell: success (episodic: share of maps whose goal was reached; reset-free: goals reached / n_goals), absorbed
(share of episodes that entered a state the oracle says cannot reach the goal), bad-action rate (replies with no
move), shield precision against the oracle. Writes bench/results/reversal_llm_NAME.{json,md}. The scripted
baselines' table is bench/reversal.py.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

OUT = Path(__file__).parent / "results"


def cell(model, tok, rho: float, mode: str, shield: str, a) -> dict[str, float]:
    from posttrain.envs.base import make_env
    from posttrain.tasks.load import load_task
    from posttrain.loop.evaluate import evaluate
    from posttrain.models import stop_token_ids
    from posttrain.sampling import HFSampler
    from posttrain.types import SampleParams

    task = load_task("reversal", {"rho": rho, "mode": mode, "shield": shield, "size": a.size, "n_eval": a.maps,
                                  "max_turns": a.max_turns, "max_tokens": a.max_tokens})
    params = SampleParams(max_tokens=a.max_tokens, temperature=0.0)
    sampler = HFSampler(model, tok, stop_token_ids(model, tok), prefix_cache_tokens=1 << 20)
    m, _ = evaluate(make_env(task, tok, params), sampler, task.eval_rows[: a.maps], params)
    return {k.removeprefix("eval/reversal/"): v for k, v in m.items() if k.startswith("eval/reversal/")} | {
        "seconds": m["eval/seconds"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default", help="'default', a HF folder or a run's final/ folder")
    ap.add_argument("--name", default=None, help="results file suffix (default: the model folder's name)")
    ap.add_argument("--maps", type=int, default=16, help="held-out maps per cell")
    ap.add_argument("--size", type=int, default=5)
    ap.add_argument("--max-turns", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--rho", type=float, nargs="+", default=[0.0, 0.5, 1.0])
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from posttrain.models import load_model

    model, tok = load_model(a.model)
    name = a.name or Path(a.model.rstrip("/")).parent.name or a.model
    rows = []
    t0 = time.perf_counter()
    for rho in a.rho:
        for mode in ("episodic", "reset_free"):
            for shield in ("off", "on"):
                r = {"rho": rho, "mode": mode, "shield": shield, **cell(model, tok, rho, mode, shield, a)}
                rows.append(r)
                print(f"rho={rho} {mode} shield={shield}: success={r.get('success', 0):.2f} "
                      f"absorbed={r.get('absorbed', 0):.2f} [{r['seconds']:.0f}s]", flush=True)

    def f(r, k, fmt="{:.2f}"):
        v = r.get(k, math.nan)
        return "-" if math.isnan(v) else fmt.format(v)

    lines = [f"model={a.model} maps={a.maps} size={a.size} max_turns={a.max_turns} max_tokens={a.max_tokens} "
             f"greedy ({time.perf_counter() - t0:.0f} s)", "",
             "| rho | mode | shield | success | absorbed | bad actions | vetoes/ep | shield precision |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['rho']:.1f} | {r['mode']} | {r['shield']} | {f(r, 'success')} | {f(r, 'absorbed')} | "
                     f"{f(r, 'bad_action_rate')} | {f(r, 'vetoes', '{:.1f}')} | {f(r, 'shield_precision')} |")
    table = "\n".join(lines)
    print(table)
    OUT.mkdir(exist_ok=True)
    (OUT / f"reversal_llm_{name}.json").write_text(json.dumps({"args": vars(a), "rows": rows}, indent=1))
    (OUT / f"reversal_llm_{name}.md").write_text(table + "\n")


if __name__ == "__main__":
    main()
