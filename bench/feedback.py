"""Learning from words on a set where GRPO is flat: the rows the model cannot solve at all (pass@k = 0).

    python bench/feedback.py select [--task json-extract --k 16 --n-train 96 --out bench/results/feedback/hard.json]
    python bench/feedback.py run    [--methods grpo,hint --seeds 0,1,2 --steps 20 --subset ...]
    python bench/feedback.py table  [--runs bench/results/feedback/runs]
    python bench/feedback.py sftldr [--from insights-s0 --steps 60]     SFTL;DR from an insights run, then eval
    python bench/feedback.py profile RUN_DIR                              RISED: which behaviours rose and fell

`select` samples k completions per row at the training temperature with the base model and keeps the train and
held-out rows where none passed: a subset file (`task.subset`) on which GRPO's group advantage is zero at the
start, so any movement must come from elsewhere. `run` trains each method on that subset with the same budget
(steps, prompts per step, G) for each seed, with a held-out eval before and after (sampled pass@1 over
`--eval-samples` completions per prompt, and pass@n). `table` prints one row per method: mean and spread over
seeds. Everything is resumable: a finished run (its metrics.jsonl has the final eval) is not run again.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "feedback"

# A method is the config overrides that turn it on; everything else is shared (the same budget for all).
METHODS: dict[str, list[str]] = {
    "grpo": [],
    "hint": ["algorithm.hint_distill.enabled=true"],
    "insights": ["algorithm.insights.enabled=true"],
    "rised": ["algorithm.rised.enabled=true"],
    "rised-nosel": ["algorithm.rised.enabled=true", "algorithm.rised.selection=false"],  # the selection ablation
}


def select(args: argparse.Namespace) -> None:
    from posttrain.config import load_config
    from posttrain.loop.components import build
    from posttrain.loop.evaluate import evaluate_async

    cfg = load_config(None, [f"task.name={args.task}", f"sampling.temperature={args.temperature}",
                             f"model.threads={args.threads}"])
    c = build(cfg, log=lambda *a: None)
    params = c.train_params
    out: dict[str, list[int]] = {}
    stats: dict[str, float] = {}
    for split, rows in (("train", c.task.train_rows[: args.n_train]), ("eval", c.task.eval_rows)):
        # Two stages: a few samples throw out the rows the model already solves (most of the solvable ones),
        # then only the survivors get the rest of the k samples.
        alive, t0 = list(range(len(rows))), time.perf_counter()
        for stage, k in enumerate((args.first_k, args.k - args.first_k)):
            if k <= 0:
                continue
            survivors: list[int] = []
            for start in range(0, len(alive), args.chunk):
                idx = alive[start:start + args.chunk]
                _, trajs = asyncio.run(evaluate_async(c.env, c.sampler, [rows[i] for i in idx], params, samples=k))
                survivors += [i for j, i in enumerate(idx) if not any(t.passed for t in trajs[j * k:(j + 1) * k])]
                print(f"  {split} stage {stage + 1} ({k} samples/row): {start + len(idx)}/{len(alive)} rows, "
                      f"{len(survivors)} without a pass ({time.perf_counter() - t0:.0f} s)", flush=True)
            alive = survivors
        keep = alive
        out[split] = keep
        stats[f"{split}_rows"], stats[f"{split}_hard"] = float(len(rows)), float(len(keep))
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**out, "k": args.k, "task": args.task, "temperature": args.temperature,
                                "stats": stats}, indent=1))
    print(f"wrote {path}: {len(out['train'])} train and {len(out['eval'])} held-out rows with pass@{args.k} = 0")


def _final_eval(run_dir: Path) -> dict | None:
    p = run_dir / "metrics.jsonl"
    if not p.exists():
        return None
    evals = [json.loads(x) for x in p.read_text().splitlines() if '"kind": "eval"' in x]
    return evals[-1] if evals and evals[-1].get("step", 0) > 0 else None


def run(args: argparse.Namespace) -> None:
    from posttrain.config import load_config
    from posttrain.loop import train

    runs = Path(args.runs)
    for method in args.methods.split(","):
        if method not in METHODS:
            sys.exit(f"unknown method {method!r}; known: {', '.join(METHODS)}")
        for seed in [int(s) for s in args.seeds.split(",")]:
            run_dir = runs / f"{method}-s{seed}"
            if _final_eval(run_dir) is not None:
                print(f"{run_dir.name}: done already")
                continue
            overrides = [f"task.name={args.task}", f"task.subset={args.subset}", f"run.seed={seed}",
                         f"run.output_dir={runs}", f"run.name={run_dir.name}", f"loop.steps={args.steps}",
                         f"loop.prompts_per_step={args.prompts_per_step}", f"loop.eval_every={args.steps}",
                         # the base model's eval is the same for every method: grpo's run measures it
                         f"loop.eval_before={'true' if method == 'grpo' else 'false'}",
                         f"loop.eval_samples={args.eval_samples}", f"loop.eval_prompts={args.eval_prompts}",
                         "sampling.eval_temperature=0.7", "sampling.temperature=0.7", "loop.save_every=0",
                         "logging.tensorboard=false", f"model.threads={args.threads}", *METHODS[method],
                         *args.set]
            print(f"{run_dir.name}: {' '.join(METHODS[method]) or '(plain GRPO)'}", flush=True)
            t0 = time.perf_counter()
            train(load_config(None, overrides))
            print(f"{run_dir.name}: {time.perf_counter() - t0:.0f} s", flush=True)
    table(args)


def table(args: argparse.Namespace) -> None:
    runs = Path(args.runs)
    rows: dict[str, list[tuple[int, dict, dict]]] = {}
    for d in sorted(runs.glob("*-s*")):
        p = d / "metrics.jsonl"
        if not p.exists():
            continue
        evals = [json.loads(x) for x in p.read_text().splitlines() if '"kind": "eval"' in x]
        method, seed = d.name.rsplit("-s", 1)
        if not evals or not seed.isdigit():
            continue
        if len(evals) == 1:  # evaluated once (no eval before, or SFTL;DR): before is grpo's eval 0 of the seed
            base = runs / f"grpo-s{seed}" / "metrics.jsonl"
            if not base.exists():
                continue
            evals = [json.loads(base.read_text().splitlines()[0]), evals[0]]
        rows.setdefault(method, []).append((int(seed), evals[0], evals[-1]))

    def ms(xs: list[float]) -> str:
        xs = [100 * x for x in xs]
        sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
        return f"{statistics.mean(xs):5.1f} ± {sd:4.1f}"

    print("| method | seeds | held-out pass@1 before | after | pass@n before | after | after, insights in context "
          "| per seed (pass@1 after) |")
    print("|---|---|---|---|---|---|---|---|")
    for method, rs in rows.items():
        rs.sort()
        b1, a1 = [r[1]["eval/pass_rate"] for r in rs], [r[2]["eval/pass_rate"] for r in rs]
        bn, an = ([r[1].get("eval/pass_at_n", 0.0) for r in rs], [r[2].get("eval/pass_at_n", 0.0) for r in rs])
        # RLTL;DR's eval also answers with the policy's own insights in context (a second attempt per failure)
        ins = [r[2]["eval/insights/pass_rate"] for r in rs if "eval/insights/pass_rate" in r[2]]
        per = ", ".join(f"s{r[0]}: {100 * r[2]['eval/pass_rate']:.1f}" for r in rs)
        print(f"| {method} | {len(rs)} | {ms(b1)} | {ms(a1)} | {ms(bn)} | {ms(an)} | {ms(ins) if ins else '-'} | {per} |")


def sftldr(args: argparse.Namespace) -> None:
    """SFTL;DR: supervised training on an insights run's (task, insight) pairs, no rollouts; then the same held-out
    eval as the runs (its before/after rows join the table as `sftldr`)."""
    from posttrain.config import load_config
    from posttrain.loop import train
    from posttrain.training.sft import read_sft_rows, sft

    runs = Path(args.runs)
    src = runs / getattr(args, "from")
    rows = read_sft_rows(src / "insights.jsonl", args.target)
    seed = int(src.name.rsplit("-s", 1)[1])
    model_dir = runs / f"sftldr-{args.target}-model-s{seed}"
    import torch

    torch.set_num_threads(args.threads)  # the SFT runs in this process: keep it to its share of the cores
    res = sft(rows, "default", model_dir, steps=args.steps, lr=args.lr, batch_size=8, seed=seed)
    print(f"sft on {len(rows)} ({args.target}) rows: nll {res['nll_first']:.3f} -> {res['nll_last']:.3f}")
    # The eval: a zero-step run from the SFT model with the runs' eval settings (before == after: one eval).
    over = [f"model.name={model_dir}", f"task.name={args.task}", f"task.subset={args.subset}", f"run.seed={seed}",
            f"run.output_dir={runs}", f"run.name=sftldr-{args.target}-s{seed}", "loop.steps=0", "loop.eval_before=true",
            f"loop.eval_samples={args.eval_samples}", f"loop.eval_prompts={args.eval_prompts}",
            "sampling.eval_temperature=0.7", "logging.tensorboard=false",
            f"model.threads={args.threads}"]
    train(load_config(None, over))


def probe(args: argparse.Namespace) -> None:
    """The test every self-teacher method rests on: does the policy answer better with the hint in its context
    than without? Sample the held-out hard rows plainly, take each failed sample's feedback, and sample the same
    rows again with that feedback appended as hint distillation writes it (algorithm.hint_distill.template).
    If the hinted policy is not better, a reverse KL toward it teaches nothing useful."""
    import json as _json
    from dataclasses import replace

    from posttrain.config import load_config
    from posttrain.loop.components import build
    from posttrain.loop.evaluate import evaluate
    from posttrain.guidance.insights import append_to_prompt

    cfg = load_config(None, [f"task.name={args.task}", f"task.subset={args.subset}", f"model.threads={args.threads}",
                             "sampling.eval_temperature=0.7"])
    c = build(cfg, log=lambda *a: None)
    rows = c.task.eval_rows[: args.eval_prompts]
    template = cfg.algorithm.hint_distill.template
    params = replace(c.eval_params, temperature=0.7)
    _, plain = evaluate(c.env, c.sampler, rows, params, args.samples)  # scoring attaches each failure's feedback
    hinted_rows = [append_to_prompt(t.row, template.format(hint=t.feedback)) for t in plain if t.feedback]
    _, hinted = evaluate(c.env, c.sampler, hinted_rows, params, 1)

    def share(trajs, comp):
        return sum(t.reward_components.get(comp, 0.0) >= 1.0 for t in trajs) / max(len(trajs), 1)

    print(f"{len(plain)} plain samples on {len(rows)} hard held-out rows; {len(hinted)} failed ones re-asked with "
          f"their feedback as a hint ('{template.strip()[:30]}...')")
    print("| samples | n | only JSON (json_parse = 1) | schema valid | exact (the pass) |")
    print("|---|---|---|---|---|")
    for name, tr in (("plain", plain), ("with the hint", hinted)):
        print(f"| {name} | {len(tr)} | {100 * share(tr, 'json_parse'):.1f}% | {100 * share(tr, 'json_schema'):.1f}% | "
              f"{100 * share(tr, 'json_exact'):.1f}% |")
    for t in hinted[:3]:
        print("  hinted sample:", _json.dumps(t.completion_text[:120]))


def profile(args: argparse.Namespace) -> None:
    """RISED's profile report: each tag's share of rollouts over the first and the last `--window` steps."""
    recs = [json.loads(x) for x in (Path(args.run_dir) / "metrics.jsonl").read_text().splitlines()
            if '"kind": "train"' in x]
    tags = sorted({k for r in recs for k in r if k.startswith("rised/") and k not in
                   ("rised/tag_errors", "rised/selection_overlap")})
    if not tags:
        sys.exit(f"{args.run_dir}: no rised/ metrics (was algorithm.rised.enabled on?)")
    w = min(args.window, max(len(recs) // 2, 1))
    first, last = recs[:w], recs[-w:]
    print(f"| tag | first {w} steps | last {w} steps | change |")
    print("|---|---|---|---|")
    for t in tags:
        a = statistics.fmean(r.get(t, 0.0) for r in first)
        b = statistics.fmean(r.get(t, 0.0) for r in last)
        print(f"| {t[6:]} | {100 * a:.1f}% | {100 * b:.1f}% | {100 * (b - a):+.1f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("select", help="find the rows with pass@k = 0 and write a task.subset file")
    s.add_argument("--task", default="json-extract")
    s.add_argument("--k", type=int, default=16)
    s.add_argument("--first-k", type=int, default=4, help="samples per row in the first, cheap stage")
    s.add_argument("--n-train", type=int, default=96, help="train rows to examine (the first N)")
    s.add_argument("--temperature", type=float, default=0.7, help="the training temperature")
    s.add_argument("--chunk", type=int, default=4, help="rows per sampling batch (x k completions)")
    s.add_argument("--threads", type=int, default=2)
    s.add_argument("--out", default=str(OUT / "hard_json.json"))
    r = sub.add_parser("run", help="train every method on the subset, seeds x methods, then print the table")
    r.add_argument("--task", default="json-extract")
    r.add_argument("--subset", default=str(OUT / "hard_json.json"))
    r.add_argument("--methods", default="grpo,hint")
    r.add_argument("--seeds", default="0,1,2")
    r.add_argument("--steps", type=int, default=20)
    r.add_argument("--prompts-per-step", type=int, default=4)
    r.add_argument("--eval-samples", type=int, default=4)
    r.add_argument("--eval-prompts", type=int, default=24, help="held-out prompts per eval (the first N hard ones)")
    r.add_argument("--threads", type=int, default=2)
    r.add_argument("--runs", default=str(OUT / "runs"))
    r.add_argument("--set", nargs="*", default=[], help="more config overrides for every run (a.b=c)")
    t = sub.add_parser("table", help="print the table of finished runs")
    t.add_argument("--runs", default=str(OUT / "runs"))
    f = sub.add_parser("sftldr", help="SFTL;DR from an insights run's insights.jsonl, then the held-out eval")
    f.add_argument("--from", default="insights-s0", help="the insights run (a folder under --runs)")
    f.add_argument("--target", default="insight", choices=["insight", "answer"])
    f.add_argument("--steps", type=int, default=60)
    f.add_argument("--lr", type=float, default=1e-5)
    f.add_argument("--task", default="json-extract")
    f.add_argument("--subset", default=str(OUT / "hard_json.json"))
    f.add_argument("--eval-samples", type=int, default=4)
    f.add_argument("--eval-prompts", type=int, default=24)
    f.add_argument("--threads", type=int, default=2)
    f.add_argument("--runs", default=str(OUT / "runs"))
    q = sub.add_parser("probe", help="does the policy do better with the feedback hint in context than without?")
    q.add_argument("--task", default="json-extract")
    q.add_argument("--subset", default=str(OUT / "hard_json.json"))
    q.add_argument("--eval-prompts", type=int, default=24)
    q.add_argument("--samples", type=int, default=4)
    q.add_argument("--threads", type=int, default=1)
    p = sub.add_parser("profile", help="RISED profile report of a run: tag shares, first vs last steps")
    p.add_argument("run_dir")
    p.add_argument("--window", type=int, default=5)
    args = ap.parse_args()
    {"select": select, "run": run, "table": table, "sftldr": sftldr, "profile": profile, "probe": probe}[args.cmd](args)


if __name__ == "__main__":
    main()
