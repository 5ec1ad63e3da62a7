"""search-qa: answer quality vs number of searches, for policies trained at different search prices λ.

Evaluates each model greedily on all held-out rows and splits the result by question kind (facts given in the
prompt, single-hop, two-hop): share answered correctly, searches per episode, and the reward each λ would give.
Writes bench/results/search_qa_tradeoff.{json,md}.

    # evaluate models that exist (the defaults are the runs below)
    python bench/search_qa_tradeoff.py --model base=default --model "warm start=runs/sqa-ws/final" \\
        --model "RL λ=0.05=runs/sqa-l0.05/final" --model "RL λ=0.6=runs/sqa-l0.6/final"

    # the runs (about 12 min for the warm start, 11 min per λ on a 2-core CPU):
    posttrain train task.name=search-qa warm_start.steps=24 loop.steps=0 loop.eval_prompts=60 run.name=sqa-ws
    posttrain train task.name=search-qa model.name=runs/sqa-ws/final task.options.search_cost=0.05 \\
        trainer.lr=3e-5 loop.eval_prompts=60 loop.eval_before=false loop.time_budget_s=540 loop.steps=200 \\
        run.name=sqa-l0.05          # and the same with search_cost=0.6, run.name=sqa-l0.6
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from posttrain.config import load_config
from posttrain.loop.components import build
from posttrain.loop.evaluate import evaluate

OUT = Path(__file__).parent / "results"
KINDS = [("given", lambda r: r["given"]), ("1-hop", lambda r: not r["given"] and r["hops"] == 1),
         ("2-hop", lambda r: not r["given"] and r["hops"] == 2)]


def evaluate_model(path: str, prompts: int) -> dict:
    cfg = load_config(None, [f"model.name={path}", "task.name=search-qa", f"loop.eval_prompts={prompts}",
                             "logging.console=false", "logging.tensorboard=false"])
    c = build(cfg, log=lambda s: None)
    rows = c.task.eval_rows[:prompts]
    _, trajs = evaluate(c.env, c.sampler, rows, c.eval_params)
    out: dict = {"n": len(trajs)}
    for kind, pick in [("all", lambda r: True)] + KINDS:
        ts = [t for t in trajs if pick(t.row)]
        if not ts:
            continue
        out[kind] = {"n": len(ts),
                     "correct": statistics.fmean(t.reward_components["correct"] for t in ts),
                     "searches": statistics.fmean(t.reward_components["num_searches"] for t in ts),
                     "answered": statistics.fmean(t.reward_components["format"] for t in ts)}
    return out


def reward_at(res: dict, lam: float) -> float:
    a = res["all"]
    return a["correct"] + 0.1 * a["answered"] - lam * a["searches"]


def table(results: dict[str, dict], lambdas: list[float]) -> str:
    head = ["model", "correct", "searches/episode"] + [f"{k}: correct / searches" for k, _ in KINDS]
    head += [f"reward at λ={lam:g}" for lam in lambdas]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, r in results.items():
        cells = [label, f"{r['all']['correct'] * 100:.1f}%", f"{r['all']['searches']:.2f}"]
        cells += [f"{r[k]['correct'] * 100:.0f}% / {r[k]['searches']:.2f}" if k in r else "-" for k, _ in KINDS]
        cells += [f"{reward_at(r, lam):.3f}" for lam in lambdas]
        lines.append("| " + " | ".join(cells) + " |")
    n = next(iter(results.values()))
    kinds = ", ".join(f"{n[k]['n']} {k}" for k, _ in KINDS if k in n)
    return "\n".join(lines) + f"\n\nHeld-out rows: {n['n']} ({kinds}), greedy, one episode each.\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", action="append", default=[], help="label=path (repeatable)")
    ap.add_argument("--prompts", type=int, default=60)
    ap.add_argument("--lambda", dest="lambdas", type=float, action="append", default=[])
    args = ap.parse_args()
    models = args.model or ["base=default", "warm start=runs/sqa-ws/final", "RL λ=0.05=runs/sqa-l0.05/final",
                            "RL λ=0.6=runs/sqa-l0.6/final"]
    lambdas = args.lambdas or [0.05, 0.6]
    results = {}
    for spec in models:
        label, _, path = spec.rpartition("=")
        if not label:
            raise SystemExit(f"--model wants label=path, got {spec!r}")
        print(f"evaluating {label} ({path}) ...", flush=True)
        results[label] = evaluate_model(path, args.prompts)
        r = results[label]["all"]
        print(f"  correct {r['correct'] * 100:.1f}%  searches/episode {r['searches']:.2f}", flush=True)
    md = table(results, lambdas)
    print(md)
    OUT.mkdir(exist_ok=True)
    (OUT / "search_qa_tradeoff.json").write_text(json.dumps(results, indent=2))
    (OUT / "search_qa_tradeoff.md").write_text(md)


if __name__ == "__main__":
    main()
