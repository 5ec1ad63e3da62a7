"""posttrain vs TRL's GRPOTrainer on the same GRPO work, timed step by step.

Both frameworks train the same model on the built-in `json-extract` task with the same recipe: the same
prompts in the same order (posttrain's seeded order), 4 prompts x G=4 = 16 completions per optimizer step,
at most 64 new tokens and no stop strings (the task's are switched off: TRL has none), temperature 1.0
(top_p 1, no top-k), no KL (beta 0, no reference model), token-mean clipped loss (epsilon 0.2), group-std-scaled advantages, AdamW (betas 0.9/0.99, no weight decay, constant lr,
grad-norm clip 1.0), fp32, no gradient checkpointing (unless `--checkpointing`), 2 threads, one optimizer pass per batch. Full fine-tune
at lr 1e-5, or with `--lora` LoRA r=16 / alpha=32 on q,k,v,o,gate,up,down at lr 1e-4.

Per step it records: wall seconds of the whole step (generation + rewards + update), generation seconds,
rollout tokens/s (completion tokens / generation seconds) and the mean reward. posttrain's numbers come from
its metrics.jsonl (`time/step`, `time/sample`, `tokens/completion`, `reward/mean`; the before/after evals are
outside the steps). TRL's come from a TrainerCallback (`on_step_begin` -> `on_step_end`), a timer wrapped
around `GRPOTrainer._generate` (tokenize + `generate` + decode, the counterpart of posttrain's sample stage)
and TRL's logged `reward`. Each framework runs in its own child process (this script with `--only ...`), so
the peak RSS of one does not include the other.

    python bench/vs_trl.py [--lora] [--steps K] [--model default|tiny-random|PATH] [--only posttrain|trl]
                           [--precision fp32|bf16|int8] [--train-precision fp32|bf16] [--chunk N] [--checkpointing]
                           [--matmul auto|onednn|mkl] [--packed auto|on|off]

`--precision int8` samples posttrain's rollouts with an int8 copy of the policy (sampling.precision; the ratio
then uses the sampler's log-probs with TIS) and also runs posttrain in fp32, printed as its own column.
`--train-precision bf16` trains posttrain under bf16 autocast (trainer.precision: mixed precision, fp32 weights
and optimizer) and likewise adds the all-fp32 posttrain column. `--chunk N` sets trainer.logits_chunk_tokens. `--checkpointing` turns activation checkpointing on in both
frameworks (posttrain's trainer.gradient_checkpointing; TRL's own switch, which GRPOConfig has on by default).
`--matmul` and `--packed` set posttrain's model.cpu_matmul and sampling.packed_weights (TRL runs torch's defaults:
MKL for fp32 matmuls). The title records the CPU: the ratios depend on its instruction set and vendor.

Prints a per-step table per framework and a summary (medians over all steps and over steps 2..K, the first
step carrying warm-up), then posttrain's own stage times (time/forward_backward, time/sync, ...: where its update
goes), and writes bench/results/vs_trl[_lora].json and .md. Needs the `bench` extra (trl).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from functools import wraps
from pathlib import Path

from posttrain.obs.machine import cpu_line
from posttrain.obs.memory import peak_rss_mb  # ru_maxrss in MB on Linux and macOS

FRAMEWORKS = ("posttrain", "trl", "posttrain_fp32")
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
JSON_COLUMNS = ("schema", "expected")  # nested values whose shape varies per row: Arrow needs them as strings


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=8, help="optimizer steps per framework")
    p.add_argument("--model", default="default", help="'default' (SmolLM2-135M-Instruct), 'tiny-random' or a HF folder")
    p.add_argument("--lora", action="store_true", help="LoRA r=16 alpha=32 on all linear projections")
    p.add_argument("--lr", type=float, default=None, help="default: 1e-5 full fine-tune, 1e-4 LoRA")
    p.add_argument("--only", choices=FRAMEWORKS, help="run one framework in this process (used for the children)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--generations", type=int, default=4, help="G: completions per prompt")
    p.add_argument("--prompts-per-step", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--precision", choices=("fp32", "bf16", "int8"), default="fp32", help="posttrain's sampler")
    p.add_argument("--train-precision", choices=("fp32", "bf16"), default="fp32",
                   help="posttrain's trainer.precision (bf16: mixed precision under autocast)")
    p.add_argument("--chunk", type=int, default=0, help="posttrain's trainer.logits_chunk_tokens")
    p.add_argument("--matmul", choices=("auto", "onednn", "mkl"), default="auto", help="posttrain's model.cpu_matmul")
    p.add_argument("--packed", choices=("auto", "on", "off"), default="auto",
                   help="posttrain's sampling.packed_weights")
    p.add_argument("--checkpointing", action="store_true",
                   help="activation checkpointing in both (posttrain trainer.gradient_checkpointing, TRL's own)")
    p.add_argument("--results", default=str(Path(__file__).resolve().parent / "results"), help="output folder")
    p.add_argument("--out", help=argparse.SUPPRESS)  # child: where to write its JSON result
    args = p.parse_args(argv)
    args.lr = args.lr if args.lr is not None else (1e-4 if args.lora else 1e-5)
    return args


def resolve_model(name: str, tmp: str) -> str:
    """A HF folder both frameworks can load (TRL needs a folder, so tiny-random is saved once)."""
    if name == "default":
        from posttrain.models.default import default_model_dir
        return str(default_model_dir())
    if name == "tiny-random":
        from posttrain.models.tiny import tiny_random_model
        model, tok = tiny_random_model()
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        return tmp
    return name


# ---- posttrain ----------------------------------------------------------------------------------------------
def posttrain_overrides(args: argparse.Namespace, out: str) -> list[str]:
    """The posttrain run's config overrides: the same recipe as TRL's below."""
    overrides = [
        f"model.name={args.model}", "model.dtype=float32", f"model.threads={args.threads}", f"run.seed={args.seed}",
        f"run.output_dir={out}", "task.name=json-extract", f"sampling.max_tokens={args.max_tokens}",
        "sampling.temperature=1.0", "sampling.top_p=1.0", "sampling.top_k=0", "sampling.stop=[]", "algorithm.beta=0.0",
        f"algorithm.num_generations={args.generations}", f"loop.prompts_per_step={args.prompts_per_step}",
        f"loop.steps={args.steps}", "loop.num_iterations=1", "loop.eval_prompts=1", "loop.eval_every=0",
        "loop.save_every=0", f"trainer.lr={args.lr}", "logging.tensorboard=false",
    ]
    if args.lora:
        overrides += ["lora.enabled=true", "lora.r=16", "lora.alpha=32", "lora.dropout=0.0"]
    # The posttrain_fp32 child is the same run in fp32 throughout, the column beside a low-precision one.
    fp32 = args.only == "posttrain_fp32"
    overrides.append(f"sampling.precision={'fp32' if fp32 else args.precision}")
    overrides.append(f"trainer.precision={'fp32' if fp32 else args.train_precision}")
    overrides += [f"model.cpu_matmul={args.matmul}", f"sampling.packed_weights={args.packed}"]
    if args.chunk:
        overrides.append(f"trainer.logits_chunk_tokens={args.chunk}")
    if args.checkpointing:
        overrides.append("trainer.gradient_checkpointing=true")
    return overrides


def run_posttrain(args: argparse.Namespace, out: str) -> list[dict]:
    from posttrain.config import load_config
    from posttrain.loop import train

    res = train(load_config(None, posttrain_overrides(args, out)))
    records = [json.loads(line) for line in (Path(res.run_dir) / "metrics.jsonl").read_text().splitlines() if line]
    return [{"step": m["step"], "seconds": m["time/step"], "gen_seconds": m["time/sample"],
             "tokens": m["tokens/completion"], "reward": m["reward/mean"],
             "stages": {k[5:]: v for k, v in m.items() if k.startswith("time/") and k not in ("time/step",
                                                                                               "time/sample")}}
            for m in records if m.get("kind") == "train"]


# ---- TRL ----------------------------------------------------------------------------------------------------
def _json_columns(func):
    """Give a reward function the nested `schema`/`expected` values back from their JSON strings."""
    @wraps(func)
    def wrapped(completions, **kwargs):
        for col in JSON_COLUMNS:
            if col in kwargs:
                kwargs[col] = [json.loads(v) if isinstance(v, str) else v for v in kwargs[col]]
        return func(completions, **kwargs)
    return wrapped


def trl_dataset(args: argparse.Namespace, task):
    """posttrain's prompts, in posttrain's per-step order, so that step s sees the same 4 prompts in both."""
    from datasets import Dataset
    from posttrain.loop.collect import prompts_for_step

    n = len(task.train_rows)
    rows = [task.train_rows[i] for s in range(args.steps)
            for i in prompts_for_step(n, s, args.prompts_per_step, args.seed)]
    return Dataset.from_list([{k: json.dumps(v) if k in JSON_COLUMNS else v for k, v in r.items()} for r in rows])


def run_trl(args: argparse.Namespace, out: str) -> list[dict]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback, set_seed
    from trl import GRPOConfig, GRPOTrainer
    from posttrain.tasks.load import load_task

    set_seed(args.seed)
    task = load_task("json-extract", seed=args.seed)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32, attn_implementation="sdpa")
    tok = AutoTokenizer.from_pretrained(args.model)
    peft_config = None
    if args.lora:
        from peft import LoraConfig
        peft_config = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=LORA_TARGETS,
                                 task_type="CAUSAL_LM")
    # GRPOConfig defaults to gradient checkpointing on; transformers >= 5 renamed the switch. Off unless asked.
    no_ckpt = {"activation_checkpointing" if "activation_checkpointing" in GRPOConfig.__dataclass_fields__
               else "gradient_checkpointing": bool(args.checkpointing)}
    config = GRPOConfig(
        output_dir=out, seed=args.seed, max_steps=args.steps, use_cpu=True, bf16=False, fp16=False, **no_ckpt,
        report_to="none", save_strategy="no", logging_steps=1, disable_tqdm=True,
        # per_device_train_batch_size counts completions, not prompts: 16 = 4 prompts x G=4; with
        # gradient_accumulation_steps=1, steps_per_generation=1 and generation_batch_size=16 (one generation
        # per optimizer step, so no extra "old logprobs" forward pass).
        per_device_train_batch_size=args.prompts_per_step * args.generations, gradient_accumulation_steps=1,
        num_generations=args.generations, num_iterations=1, shuffle_dataset=False,
        max_completion_length=args.max_tokens, temperature=1.0, top_p=1.0, top_k=0, use_vllm=False,
        beta=0.0, loss_type="dapo", epsilon=0.2, scale_rewards="group",  # dapo = token mean over the batch
        reward_weights=[c.weight for c in task.rubric.components],
        learning_rate=args.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        adam_beta1=0.9, adam_beta2=0.99, max_grad_norm=1.0,
        dataloader_num_workers=0, dataloader_pin_memory=False, log_completions=False,
    )
    trainer = GRPOTrainer(model=model, processing_class=tok, args=config, peft_config=peft_config,
                          reward_funcs=[_json_columns(c.func) for c in task.rubric.components],
                          train_dataset=trl_dataset(args, task))
    assert trainer.ref_model is None  # beta=0: no reference model
    assert bool(config.gradient_checkpointing) == bool(args.checkpointing)

    gen_seconds, gen_tokens, step_seconds, logged = [], [], [], {}
    generate = trainer._generate  # (prompts) -> (prompt_ids, completion_ids, ...)

    def timed_generate(prompts):
        t0 = time.perf_counter()
        result = generate(prompts)
        gen_seconds.append(time.perf_counter() - t0)
        gen_tokens.append(sum(len(ids) for ids in result[1]))
        return result

    trainer._generate = timed_generate

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            step_seconds.append(time.perf_counter() - self.t0)

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "reward" in logs:
                logged[state.global_step] = dict(logs)

    trainer.add_callback(StepTimer())
    trainer.train()
    return [{"step": i + 1, "seconds": step_seconds[i], "gen_seconds": gen_seconds[i], "tokens": gen_tokens[i],
             "reward": logged.get(i + 1, {}).get("reward", float("nan"))} for i in range(len(step_seconds))]


# ---- child / parent -------------------------------------------------------------------------------------------
def child(args: argparse.Namespace) -> None:
    import torch
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"vs_trl_{args.only}_") as workdir:
        steps = (run_trl if args.only == "trl" else run_posttrain)(args, workdir)
    result = {"framework": args.only, "steps": steps, "wall_seconds": time.perf_counter() - t0,
              "peak_rss_gb": peak_rss_mb() / 1024,
              "version": _version("trl" if args.only == "trl" else "posttrain")}
    text = json.dumps(result, indent=2)
    Path(args.out).write_text(text) if args.out else print(text)


def summarize(steps: list[dict], peak_rss_gb: float) -> dict:
    warm = steps[1:] or steps  # step 1 carries the warm-up
    half = max(1, len(steps) // 2)
    tok_s = lambda ss: sum(s["tokens"] for s in ss) / max(sum(s["gen_seconds"] for s in ss), 1e-9)  # noqa: E731
    mean = lambda xs: statistics.fmean(xs) if xs else float("nan")  # noqa: E731
    return {
        "median_step_s": statistics.median(s["seconds"] for s in steps),
        "median_step_s_warm": statistics.median(s["seconds"] for s in warm),
        "median_gen_s": statistics.median(s["gen_seconds"] for s in steps),
        "median_gen_s_warm": statistics.median(s["gen_seconds"] for s in warm),
        "rollout_tok_s": tok_s(warm),
        "peak_rss_gb": peak_rss_gb,
        "reward_first_half": mean([s["reward"] for s in steps[:half]]),
        "reward_last_half": mean([s["reward"] for s in steps[half:]]) if len(steps) > 1 else float("nan"),
    }


ROWS = [("median step s (all)", "median_step_s"), ("median step s (2..K)", "median_step_s_warm"),
        ("median gen s (all)", "median_gen_s"), ("median gen s (2..K)", "median_gen_s_warm"),
        ("rollout tok/s (2..K)", "rollout_tok_s"), ("peak RSS GB", "peak_rss_gb"),
        ("reward, first half", "reward_first_half"), ("reward, last half", "reward_last_half")]
# ratio > 1 means posttrain is better: TRL time / posttrain time, posttrain tok/s / TRL tok/s, TRL RSS / posttrain RSS
RATIOS = {"median_step_s": "trl/pt", "median_step_s_warm": "trl/pt", "median_gen_s": "trl/pt",
          "median_gen_s_warm": "trl/pt", "rollout_tok_s": "pt/trl", "peak_rss_gb": "trl/pt"}


def ratio(summary: dict, key: str) -> float | None:
    pt, trl = summary["posttrain"][key], summary["trl"][key]
    num, den = (trl, pt) if RATIOS[key] == "trl/pt" else (pt, trl)
    return num / den if den else None


def step_table(name: str, steps: list[dict]) -> str:
    lines = [f"{name}", f"{'step':>4} {'seconds':>8} {'gen s':>8} {'tok/s':>8} {'reward':>7}"]
    lines += [f"{s['step']:>4} {s['seconds']:>8.2f} {s['gen_seconds']:>8.2f} "
              f"{s['tokens'] / max(s['gen_seconds'], 1e-9):>8.1f} {s['reward']:>7.3f}" for s in steps]
    return "\n".join(lines)


def stage_medians(steps: list[dict]) -> dict[str, float]:
    """posttrain's own per-stage seconds (metrics.jsonl's time/*, besides step and sample), median over steps 2..K:
    where the update's time goes, beside the step and generation times both frameworks report."""
    warm = steps[1:] or steps
    keys = sorted({k for s in warm for k in s.get("stages", {})})
    return {k: statistics.median(s["stages"][k] for s in warm if k in s.get("stages", {})) for k in keys}


def stage_markdown(results: dict) -> str:
    arms = {fw: stage_medians(r["steps"]) for fw, r in results.items() if fw.startswith("posttrain")}
    keys = sorted({k for m in arms.values() for k in m})
    if not keys:
        return ""
    lines = ["", "posttrain's stages, median s over steps 2..K:", "",
             "| stage | " + " | ".join(arms) + " |", "|---|" + "---:|" * len(arms)]
    lines += [f"| {k} | " + " | ".join(f"{m[k]:.3f}" if k in m else "" for m in arms.values()) + " |" for k in keys]
    return "\n".join(lines) + "\n"


def markdown(summary: dict, title: str) -> str:
    fp32 = "posttrain_fp32" in summary
    lines = [f"### {title}", "", "| metric | posttrain | TRL | ratio (>1: posttrain better) |"
             + (" posttrain all fp32 | ratio fp32 |" if fp32 else ""),
             "|---|---:|---:|---:|" + ("---:|---:|" if fp32 else "")]
    for label, key in ROWS:
        r = ratio(summary, key) if key in RATIOS else None
        line = (f"| {label} | {summary['posttrain'][key]:.3f} | {summary['trl'][key]:.3f} | "
                f"{f'{r:.2f}x' if r is not None else ''} |")
        if fp32:
            r32 = ratio({"posttrain": summary["posttrain_fp32"], "trl": summary["trl"]}, key) if key in RATIOS else None
            line += f" {summary['posttrain_fp32'][key]:.3f} | {f'{r32:.2f}x' if r32 is not None else ''} |"
        lines.append(line)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="vs_trl_") as tmp:
        model_path = resolve_model(args.model, tmp)
        if args.only:  # a child, or one framework run by hand (prints its JSON without --out)
            return child(argparse.Namespace(**{**vars(args), "model": model_path}))
        results = {}
        low = args.precision != "fp32" or args.train_precision != "fp32"
        for fw in FRAMEWORKS if low else FRAMEWORKS[:2]:
            out = Path(tmp) / f"{fw}.json"
            cmd = [sys.executable, str(Path(__file__).resolve()), *argv, "--only", fw, "--model", model_path,
                   "--out", str(out)]
            print(f"\n=== {fw}: {args.steps} steps on {args.model}{' (LoRA)' if args.lora else ''} ===", flush=True)
            subprocess.run(cmd, check=True)
            results[fw] = json.loads(out.read_text())
    summary = {fw: summarize(r["steps"], r["peak_rss_gb"]) for fw, r in results.items()}
    title = (f"posttrain vs TRL {results['trl'].get('version', '?')}: {args.model}, "
             f"{'LoRA r=16' if args.lora else 'full fine-tune'}, lr {args.lr:g}, {args.steps} steps x "
             f"{args.prompts_per_step} prompts x G={args.generations}, {args.max_tokens} new tokens, "
             f"{args.threads} threads, posttrain sampler {args.precision}, trainer {args.train_precision}"
             + (f", logits chunk {args.chunk}" if args.chunk else "")
             + (", activation checkpointing in both" if args.checkpointing else "")
             + f", posttrain cpu_matmul {args.matmul}, packed_weights {args.packed}; CPU: {cpu_line()}")
    print("\n" + "\n\n".join(step_table(fw, r["steps"]) for fw, r in results.items()) + "\n")
    md = markdown(summary, title) + stage_markdown(results)
    print(md)
    report = {"title": title, "args": {k: v for k, v in vars(args).items() if k not in ("out", "only")},
              "summary": summary, "ratios": {k: ratio(summary, k) for k in RATIOS}, "runs": results}
    dest = Path(args.results)
    dest.mkdir(parents=True, exist_ok=True)
    stem = (("vs_trl_lora" if args.lora else "vs_trl") + ("" if args.precision == "fp32" else f"_{args.precision}")
            + ("" if args.train_precision == "fp32" else f"_train_{args.train_precision}")
            + ("_ckpt" if args.checkpointing else "") + ("" if args.matmul == "auto" else f"_{args.matmul}")
            + ("" if args.packed == "auto" else f"_packed_{args.packed}"))
    (dest / f"{stem}.json").write_text(json.dumps(report, indent=2))
    (dest / f"{stem}.md").write_text(md)
    print(f"wrote {dest / stem}.json and .md")


def _version(framework: str) -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(framework)
    except PackageNotFoundError:
        return "?"


if __name__ == "__main__":
    main()
