"""Does the default config learn reasoning-gym tasks in 30 steps, and how does TRL's GRPOTrainer do on the same work?

For each dataset (task `reasoning_gym:<name>` with the easy config from bench/rg_survey.py's CANDIDATES) and seed,
posttrain trains with its DEFAULT config except the task, the steps, the seed, the held-out prompts, the max tokens
and `loop.eval_every` (so that held-out pass is measured every `--eval-every` steps, for "time to reach TRL's final
level"). On `--trl-datasets`, TRL's GRPOTrainer trains the same task with the same budget: the task's rubric
components as TRL reward functions with the same weights, the same prompts in the same order, the recipe of
bench/vs_trl.py (4 prompts x G=4, no KL, token-mean clipped loss, AdamW 0.9/0.99, grad clip 1, constant lr, fp32,
no checkpointing) with posttrain's default lr and temperature and the same max tokens. Its held-out eval is
posttrain's own (`loop.evaluate.evaluate`, greedy, same rows, same max tokens) run on TRL's in-memory model through
an HFSampler, at the same steps: the two columns are the same measurement.

    python bench/tasks_suite.py [--datasets a b ...] [--seeds 0 1 2] [--steps 30] [--trl-datasets a b c]
                                [--max-tokens 64] [--eval-prompts 32] [--eval-every 5] [--model default|tiny-random]
                                [--results bench/results/tasks_suite.json] [--resume] [--frameworks posttrain trl]

Each (framework, dataset, seed) runs in its own child process (this script with `--only`), and its record is added
to the results JSON as soon as it ends, so a stopped bench loses at most the run in flight; `--resume` skips the
records already there. Order: per seed, posttrain on every dataset, then TRL on its datasets. Prints the table
(dataset | framework | seeds | held-out before | after | gain | wall s | time to TRL's final level) and the ratio
posttrain/TRL of wall seconds per step, and writes it beside the JSON as .md. Needs the `bench` extra (trl).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling bench scripts, imported below
from rg_survey import CANDIDATES  # noqa: E402
from vs_trl import _version, resolve_model, trl_dataset  # noqa: E402

from posttrain.obs.machine import cpu_line  # noqa: E402
from posttrain.obs.memory import peak_rss_mb  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
# The 8 best-in-reach easy configs of bench/results/rg_survey_easy.json (greedy pass@1 on 32 prompts, 5-70%).
DEFAULT_DATASETS = ["products", "basic_arithmetic", "gcd", "chain_sum", "lcm", "decimal_chain_sum",
                    "simple_equations", "aiw"]
DEFAULT_TRL = ["basic_arithmetic", "gcd", "chain_sum"]  # some signal and room to learn; three skills
FRAMEWORKS = ("posttrain", "trl")
# Some easy configs have small problem spaces (products with one-digit factors: 81 questions). With 64 training
# items the task's split still finds disjoint held-out questions (it drops those training has); `train_size`
# is kept at the survey's 64 for every dataset so the problem spaces are used alike.
TRAIN_SIZE = 64


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--datasets", nargs="+", default=DEFAULT_DATASETS)
    p.add_argument("--trl-datasets", nargs="+", default=DEFAULT_TRL, help="TRL runs on these (a subset of --datasets)")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--max-tokens", type=int, default=64, help="answers are short numbers; sampling and eval")
    p.add_argument("--eval-prompts", type=int, default=32, help="held-out prompts (greedy)")
    p.add_argument("--eval-every", type=int, default=5, help="held-out eval every K steps, both frameworks")
    p.add_argument("--model", default="default", help="'default' (SmolLM2-135M-Instruct), 'tiny-random' or a folder")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--frameworks", nargs="+", choices=FRAMEWORKS, default=list(FRAMEWORKS))
    p.add_argument("--results", type=Path, default=ROOT / "bench" / "results" / "tasks_suite.json")
    p.add_argument("--resume", action="store_true", help="skip (framework, dataset, seed) already in --results")
    p.add_argument("--only", choices=FRAMEWORKS, help="child mode: one run, its record as JSON to --out")
    p.add_argument("--dataset", help=argparse.SUPPRESS)  # child: the dataset
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)  # child: the seed
    p.add_argument("--out", help=argparse.SUPPRESS)  # child: where its record goes
    args = p.parse_args(argv)
    unknown = [d for d in args.datasets + args.trl_datasets if d not in CANDIDATES]
    if unknown:
        p.error(f"no easy config in bench/rg_survey.py's CANDIDATES for: {', '.join(unknown)}")
    return args


# ---- the shared config ----------------------------------------------------------------------------------------
def task_overrides(dataset: str, args: argparse.Namespace) -> list[str]:
    """The task: the dataset's easy config, the survey's split sizes. JSON values are valid YAML (lists of '+')."""
    options = {**CANDIDATES[dataset], "train_size": TRAIN_SIZE, "eval_size": args.eval_prompts}
    return [f"task.name=reasoning_gym:{dataset}"] + [f"task.options.{k}={json.dumps(v)}" for k, v in options.items()]


def posttrain_overrides(args: argparse.Namespace, out: str) -> list[str]:
    """The default config, but for the task, steps, seed, held-out prompts, max tokens and the eval cadence."""
    return task_overrides(args.dataset, args) + [
        f"model.name={args.model}", f"model.threads={args.threads}", f"run.seed={args.seed}", f"run.output_dir={out}",
        f"loop.steps={args.steps}", f"loop.eval_prompts={args.eval_prompts}", f"loop.eval_every={args.eval_every}",
        f"sampling.max_tokens={args.max_tokens}", "logging.tensorboard=false", "loop.save_every=0",
    ]


# ---- posttrain ------------------------------------------------------------------------------------------------
def run_posttrain(args: argparse.Namespace, out: str) -> dict:
    from posttrain.config import load_config
    from posttrain.loop import train

    res = train(load_config(None, posttrain_overrides(args, out)))
    metrics = [json.loads(x) for x in (Path(res.run_dir) / "metrics.jsonl").read_text().splitlines() if x]
    # zero_var: the share of groups whose G rewards are all equal (no advantage, nothing learned from them)
    steps = [{"step": m["step"], "seconds": m["time/step"], "reward": m["reward/mean"],
              "zero_var": m.get("groups/zero_variance_frac")} for m in metrics if m.get("kind") == "train"]
    evals = {}
    for m in metrics:  # the last eval record at a step wins (the final eval may repeat the last periodic one)
        if m.get("kind") == "eval":
            evals[m["step"]] = {"step": m["step"], "pass": m["eval/pass_rate"], "reward": m["eval/reward/mean"],
                                "format": m.get("eval/pass/format")}
    return {"steps": steps, "evals": sorted(evals.values(), key=lambda e: e["step"]),
            "samples": _last_samples(Path(res.run_dir))}


def _last_samples(run_dir: Path, n: int = 4) -> list[dict]:
    """A few held-out replies of the first and the last eval, for the page's diagnosis (the run dir is temporary)."""
    path = run_dir / "samples.jsonl"
    if not path.exists():
        return []
    rows = [json.loads(x) for x in path.read_text().splitlines() if x]
    evals = [r for r in rows if r.get("eval")]
    short = lambda v: v[:400] if isinstance(v, str) else v  # noqa: E731
    keep = evals[:n] + evals[-n:] if len(evals) > n else evals
    return [{k: short(r[k]) for k in ("step", "completion", "reward", "components", "passed", "error", "tokens")
             if k in r} for r in keep]


# ---- TRL ------------------------------------------------------------------------------------------------------
def trl_eval(cfg, model, tok):
    """posttrain's held-out eval (same rows, same greedy params) as a function of TRL's in-memory model."""
    from posttrain.envs.base import make_env
    from posttrain.loop.components import sample_params
    from posttrain.loop.evaluate import evaluate
    from posttrain.models.load import stop_token_ids
    from posttrain.sampling.hf_sampler import HFSampler
    from posttrain.tasks.from_config import task_from_config

    task = task_from_config(cfg.task, seed=cfg.run.seed)
    train_params, eval_params = sample_params(cfg, task)
    env, rows = make_env(task, tok, train_params), task.eval_rows[: cfg.loop.eval_prompts]

    def run(step: int) -> dict:
        # HFSampler decodes with the module it is given: TRL's own model, as trained so far (no copy, no sync).
        sampler = HFSampler(model, tok, stop_token_ids(model, tok), seed=cfg.run.seed)
        was_training = model.training
        model.eval()
        m, _ = evaluate(env, sampler, rows, eval_params)
        model.train(was_training)
        return {"step": step, "pass": m["eval/pass_rate"], "reward": m["eval/reward/mean"],
                "format": m.get("eval/pass/format")}
    return task, train_params, run


def _reward_funcs(task) -> list:
    """The rubric's components as TRL reward functions (named: TRL logs by __name__)."""
    def named(component):
        def func(completions, **kwargs):
            return component.func(completions, **kwargs)
        func.__name__ = component.name
        return func
    return [named(c) for c in task.rubric.components]


def run_trl(args: argparse.Namespace, out: str) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback, set_seed
    from trl import GRPOConfig, GRPOTrainer
    from posttrain.config import load_config

    cfg = load_config(None, posttrain_overrides(args, out))  # the posttrain run's config: its defaults are the recipe
    set_seed(args.seed)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32, attn_implementation="sdpa")
    tok = AutoTokenizer.from_pretrained(args.model)
    task, params, held_out = trl_eval(cfg, model, tok)
    no_ckpt = {"activation_checkpointing" if "activation_checkpointing" in GRPOConfig.__dataclass_fields__
               else "gradient_checkpointing": False}  # as in bench/vs_trl.py: GRPOConfig defaults it on
    a, t = cfg.algorithm, cfg.trainer
    config = GRPOConfig(  # bench/vs_trl.py's recipe, with posttrain's default lr and temperature
        output_dir=out, seed=args.seed, max_steps=args.steps, use_cpu=True, bf16=False, fp16=False, **no_ckpt,
        report_to="none", save_strategy="no", logging_steps=1, disable_tqdm=True,
        per_device_train_batch_size=cfg.loop.prompts_per_step * a.num_generations, gradient_accumulation_steps=1,
        num_generations=a.num_generations, num_iterations=1, shuffle_dataset=False,
        max_completion_length=params.max_tokens, temperature=params.temperature, top_p=params.top_p, top_k=params.top_k,
        use_vllm=False, beta=a.beta, loss_type="dapo", epsilon=a.epsilon, scale_rewards="group",
        reward_weights=[c.weight for c in task.rubric.components],
        learning_rate=t.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=t.weight_decay,
        adam_beta1=t.betas[0], adam_beta2=t.betas[1], max_grad_norm=t.max_grad_norm,
        dataloader_num_workers=0, dataloader_pin_memory=False, log_completions=False,
    )
    args.prompts_per_step = cfg.loop.prompts_per_step  # what trl_dataset reads: posttrain's per-step prompt order
    trainer = GRPOTrainer(model=model, processing_class=tok, args=config, reward_funcs=_reward_funcs(task),
                          train_dataset=trl_dataset(args, task))
    evals = [held_out(0)]
    steps, logged = [], {}

    class StepTimer(TrainerCallback):
        def on_step_begin(self, a_, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, a_, state, control, **kw):
            steps.append(time.perf_counter() - self.t0)  # the step alone; the eval below is not in it
            if state.global_step % args.eval_every == 0 or state.global_step == args.steps:
                evals.append(held_out(state.global_step))

        def on_log(self, a_, state, control, logs=None, **kw):
            if logs and "reward" in logs:
                logged[state.global_step] = logs

    trainer.add_callback(StepTimer())
    trainer.train()
    return {"steps": [{"step": i + 1, "seconds": s, "reward": float(logged.get(i + 1, {}).get("reward", "nan")),
                       "zero_var": logged.get(i + 1, {}).get("frac_reward_zero_std")}
                      for i, s in enumerate(steps)], "evals": evals}


# ---- child / parent ---------------------------------------------------------------------------------------------
def child(args: argparse.Namespace) -> None:
    import torch
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"tasks_suite_{args.only}_") as workdir:
        if args.only == "trl":
            args.model = resolve_model(args.model, workdir)  # TRL needs a folder
        record = (run_trl if args.only == "trl" else run_posttrain)(args, workdir)
    record.update({"framework": args.only, "dataset": args.dataset, "seed": args.seed,
                   "wall_seconds": time.perf_counter() - t0, "peak_rss_gb": peak_rss_mb() / 1024,
                   "version": _version("trl" if args.only == "trl" else "posttrain")})
    Path(args.out).write_text(json.dumps(record))


def planned(args: argparse.Namespace) -> list[tuple[str, str, int]]:
    """(framework, dataset, seed) in run order: per seed, posttrain on every dataset, then TRL on its own."""
    runs = []
    for seed in args.seeds:
        runs += [("posttrain", d, seed) for d in args.datasets if "posttrain" in args.frameworks]
        runs += [("trl", d, seed) for d in args.trl_datasets if "trl" in args.frameworks]
    return runs


def load_results(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {"runs": []}


def done_keys(results: dict) -> set[tuple[str, str, int]]:
    return {(r["framework"], r["dataset"], r["seed"]) for r in results["runs"]}


def child_argv(args: argparse.Namespace, fw: str, dataset: str, seed: int, out: str) -> list[str]:
    return [sys.executable, __file__, "--only", fw, "--dataset", dataset, "--seed", str(seed), "--out", out,
            "--steps", str(args.steps), "--max-tokens", str(args.max_tokens), "--eval-prompts", str(args.eval_prompts),
            "--eval-every", str(args.eval_every), "--model", args.model, "--threads", str(args.threads)]


def run_all(args: argparse.Namespace) -> dict:
    results = load_results(args.results) if args.resume else {"runs": []}
    results["settings"] = {k: args.__dict__[k] for k in ("steps", "max_tokens", "eval_prompts", "eval_every",
                                                         "model", "threads")}
    results["machine"] = cpu_line()
    skip = done_keys(results)
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    for fw, dataset, seed in planned(args):
        if (fw, dataset, seed) in skip:
            continue
        print(f"== {fw} {dataset} seed {seed}", flush=True)
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            out = f.name
        rc = subprocess.run(child_argv(args, fw, dataset, seed, out), env=env).returncode
        if rc != 0 or not Path(out).stat().st_size:
            print(f"!! {fw} {dataset} seed {seed} failed (rc {rc})", flush=True)
            continue
        results["runs"].append(json.loads(Path(out).read_text()))
        Path(out).unlink()
        _write(args.results, results)  # every finished run is saved at once
    return results


def _write(path: Path, results: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(results, indent=1))
    tmp.replace(path)


# ---- the table --------------------------------------------------------------------------------------------------
def mean_std(xs: list[float]) -> tuple[float, float]:
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def time_to_level(record: dict, level: float) -> float | None:
    """Training seconds (steps only, evals excluded: both run the same eval) until the first held-out eval at or
    above `level`; None when no eval gets there."""
    per_step = {s["step"]: s["seconds"] for s in record["steps"]}
    for e in record["evals"]:
        if e["pass"] >= level - 1e-9:
            return sum(v for k, v in per_step.items() if k <= e["step"])
    return None


def steps_to_level(record: dict, level: float) -> int | None:
    """Training steps until the first held-out eval at or above `level` (None: never). Unlike seconds, a count of
    steps does not depend on what else the machine was doing."""
    return next((e["step"] for e in record["evals"] if e["pass"] >= level - 1e-9), None)


def trl_levels(runs: list[dict]) -> dict[str, float]:
    """Per dataset, TRL's final held-out pass, mean over its seeds: the level both frameworks are timed to."""
    by: dict[str, list[float]] = {}
    for r in runs:
        if r["framework"] == "trl":
            by.setdefault(r["dataset"], []).append(r["evals"][-1]["pass"])
    return {d: statistics.fmean(v) for d, v in by.items()}


def table_rows(runs: list[dict]) -> list[dict]:
    levels = trl_levels(runs)
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in runs:
        groups.setdefault((r["dataset"], r["framework"]), []).append(r)
    rows = []
    for (dataset, fw), rs in groups.items():
        before = mean_std([r["evals"][0]["pass"] for r in rs])
        after = mean_std([r["evals"][-1]["pass"] for r in rs])
        times = [time_to_level(r, levels[dataset]) for r in rs] if dataset in levels else []
        reached = [t for t in times if t is not None]
        steps = [s for s in (steps_to_level(r, levels[dataset]) for r in rs) if s is not None] if times else []
        rows.append({"dataset": dataset, "framework": fw, "seeds": sorted(r["seed"] for r in rs),
                     "before": before, "after": after, "gain": after[0] - before[0],
                     "wall_s": statistics.fmean(sum(s["seconds"] for s in r["steps"]) for r in rs),
                     "step_s": statistics.fmean(statistics.fmean(s["seconds"] for s in r["steps"]) for r in rs),
                     "to_trl_level_s": statistics.fmean(reached) if reached else None,
                     "to_trl_level_steps": statistics.fmean(steps) if steps else None,
                     "reached": f"{len(reached)}/{len(times)}" if times else ""})
    order = {d: i for i, d in enumerate(dict.fromkeys(r["dataset"] for r in runs))}
    return sorted(rows, key=lambda x: (order[x["dataset"]], x["framework"]))


def step_ratios(rows: list[dict]) -> dict[str, float]:
    """posttrain/TRL mean wall seconds per training step, per dataset with both (below 1: posttrain is faster)."""
    by = {(r["dataset"], r["framework"]): r["step_s"] for r in rows}
    return {d: by[(d, "posttrain")] / by[(d, "trl")] for d, fw in by if fw == "trl" and (d, "posttrain") in by}


def markdown(rows: list[dict]) -> str:
    def pct(ms: tuple[float, float], seeds: list) -> str:  # one seed has no spread to show
        return f"{ms[0]:.1%} ± {ms[1]:.1%}" if len(seeds) > 1 else f"{ms[0]:.1%}"

    lines = ["| dataset | framework | seeds | held-out before | after | gain | train s | s/step | to TRL's final level |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        level = "" if not r["reached"] else (f"{r['to_trl_level_s']:.0f} s, {r['to_trl_level_steps']:.0f} steps "
                                             f"({r['reached']})" if r["to_trl_level_s"] is not None
                                             else f"never ({r['reached']})")
        lines.append(f"| {r['dataset']} | {r['framework']} | {','.join(map(str, r['seeds']))} | {pct(r['before'], r['seeds'])} "
                     f"| {pct(r['after'], r['seeds'])} | {r['gain']:+.1%} | {r['wall_s']:.0f} | {r['step_s']:.1f} | {level} |")
    ratios = step_ratios(rows)
    if ratios:
        lines += ["", "posttrain/TRL wall seconds per step: " + ", ".join(f"{d} {v:.2f}" for d, v in ratios.items())]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.only:
        return child(args)
    results = run_all(args)
    if not results["runs"]:
        print("no finished runs")
        return
    md = markdown(table_rows(results["runs"]))
    print("\n" + md)
    args.results.with_suffix(".md").write_text(md)
    _write(args.results, results)
    print(f"wrote {args.results} and .md")


if __name__ == "__main__":
    main()
