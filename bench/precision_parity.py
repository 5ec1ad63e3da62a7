"""Does a low-precision sampler learn as well as the fp32 one? json-extract, the default run shortened to 30 steps,
seeds 0-2, fp32 vs another `sampling.precision` (and, with `--trainer-precision bf16`, a bf16 mixed-precision
trainer in that arm too: `trainer.precision`).

    python bench/precision_parity.py [--precision bf16] [--trainer-precision fp32|bf16] [--steps 30]
                                     [--seeds 0 1 2] [--out runs/parity]
    python bench/precision_parity.py --summarize runs/parity      # only read finished runs

Runs two trainings at a time, one thread each (`posttrain train sampling.precision=P run.seed=S loop.steps=30
model.threads=1 ...`; the base model's eval is taken once, by the first pair). Prints per run the held-out
json_exact (pass_rate) after training, the mean `train/sampler_kl_k3` (the gap between the sampler's and the
trainer's log-probs on the sampled tokens) and the mean share of tokens whose IS ratio was capped by TIS; then
per precision the mean and range over seeds. Writes bench/results/precision_parity[_trainer_bf16].{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def arm_name(prec: str, trainer_prec: str) -> str:
    return prec if trainer_prec == "fp32" else f"{prec}-trainer-{trainer_prec}"


def command(prec: str, seed: int, args, eval_before: bool, trainer_prec: str = "fp32") -> list[str]:
    return [sys.executable, "-m", "posttrain.cli", "train", f"sampling.precision={prec}",
            f"trainer.precision={trainer_prec}", f"run.seed={seed}",
            f"loop.steps={args.steps}", "model.threads=1", "loop.keep_checkpoints=0", "loop.save_every=0",
            "logging.tensorboard=false", f"loop.eval_before={str(eval_before).lower()}", f"run.output_dir={args.out}",
            f"run.name={arm_name(prec, trainer_prec)}-s{seed}"]


def launch(prec: str, seed: int, args, eval_before: bool, trainer_prec: str = "fp32") -> subprocess.Popen:
    log = open(Path(args.out) / f"{arm_name(prec, trainer_prec)}-s{seed}.log", "w")
    return subprocess.Popen(command(prec, seed, args, eval_before, trainer_prec), stdout=log,
                            stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})


def read_run(run_dir: Path) -> dict:
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    train = [r for r in recs if r["kind"] == "train"]
    evals = [r for r in recs if r["kind"] == "eval"]
    mean = lambda key: statistics.fmean(r.get(key, 0.0) for r in train)  # noqa: E731
    return {"run": run_dir.name, "steps": len(train), "after": evals[-1]["eval/pass_rate"] if evals else None,
            "before": evals[0]["eval/pass_rate"] if len(evals) > 1 else None,
            "sampler_kl_k3": mean("train/sampler_kl_k3"), "is_capped_frac": mean("train/is/is_capped_frac"),
            "sample_s": statistics.median(r["time/sample"] for r in train),
            "step_s": statistics.median(r["time/step"] for r in train),
            "train_s": statistics.median(r["time/train"] for r in train if "time/train" in r) if train else None}


def _seconds(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def summarize(out: Path, precisions: list[str], seeds: list[int], stem: str = "precision_parity") -> str:
    from posttrain.obs.machine import cpu_line

    rows = {(p, s): read_run(out / f"{p}-s{s}") for p in precisions for s in seeds if (out / f"{p}-s{s}").exists()}
    base = next((r["before"] for r in rows.values() if r["before"] is not None), None)
    lines = [f"json-extract, {next(iter(rows.values()))['steps']} steps, default recipe, seeds {seeds}; held-out "
             f"json_exact of the base model: {base if base is None else f'{base:.3f}'}", "",
             f"CPU (of the machine that summarized; the runs are on the same one unless copied): {cpu_line()}", "",
             "| arm | seed | json_exact after | sampler_kl_k3 (mean over steps) | IS-capped tokens | median sample s "
             "| median train s |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for (p, s), r in rows.items():
        lines.append(f"| {p} | {s} | {r['after']:.3f} | {max(r['sampler_kl_k3'], 0.0):.5f} | {r['is_capped_frac']:.4f} | "
                     f"{r['sample_s']:.1f} | {_seconds(r.get('train_s'))} |")
    lines += ["", "| arm | json_exact after, mean (min-max) over seeds |", "|---|---|"]
    for p in precisions:
        xs = [r["after"] for (q, _), r in rows.items() if q == p]
        if xs:
            lines.append(f"| {p} | {statistics.fmean(xs):.3f} ({min(xs):.3f}-{max(xs):.3f}) |")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{stem}.json").write_text(json.dumps({f"{p}-s{s}": r for (p, s), r in rows.items()}, indent=1))
    md = "\n".join(lines)
    (RESULTS / f"{stem}.md").write_text("# bench/precision_parity.py\n\n" + md + "\n")
    return md


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--precision", default="bf16", choices=("bf16", "int8"))
    p.add_argument("--trainer-precision", default="fp32", choices=("fp32", "bf16"),
                   help="trainer.precision of the low-precision arm (the fp32 arm stays fp32 throughout)")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--out", default="runs/parity")
    p.add_argument("--summarize", metavar="DIR", help="only summarize the runs in DIR")
    args = p.parse_args(argv)
    precisions = ["fp32", arm_name(args.precision, args.trainer_precision)]
    # The arm's own results file: a bf16-trainer comparison does not overwrite the sampler-only one.
    stem = "precision_parity" + ("" if args.trainer_precision == "fp32" else f"_trainer_{args.trainer_precision}")
    if args.summarize:
        print(summarize(Path(args.summarize), precisions, args.seeds, stem))
        return
    Path(args.out).mkdir(parents=True, exist_ok=True)
    for i, seed in enumerate(args.seeds):
        procs = [launch("fp32", seed, args, eval_before=i == 0),
                 launch(args.precision, seed, args, eval_before=i == 0, trainer_prec=args.trainer_precision)]
        for proc in procs:
            if proc.wait() != 0:
                sys.exit(f"a run failed: see {args.out}/*-s{seed}.log")
        print(f"seed {seed} done", flush=True)
    print(summarize(Path(args.out), precisions, args.seeds, stem))


if __name__ == "__main__":
    main()
