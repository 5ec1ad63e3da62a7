"""Record (or check) the train records of two seeded reference runs, to prove a refactor kept behaviour.

    python scripts/reference_metrics.py write   # runs both and writes tests/loop/reference/*.json
    python scripts/reference_metrics.py check   # runs both and compares with the committed files

Timings (`time/*`, `perf/*`, `async/*_s`) differ run to run and are left out. Counts and names must be equal;
floats must agree to a relative 1e-5 (absolute 1e-6 near zero). The runs use one torch thread, yet a new torch or
transformers build still moves the last bits of a float (a grad norm 0.66074276 against 0.66074264 once failed CI on
exact equality); a behaviour change moves them by far more than 1e-5.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

REF_DIR = Path(__file__).resolve().parent.parent / "tests" / "loop" / "reference"
# model.cpu_matmul=mkl: the references were recorded with torch's MKL matmuls; oneDNN rounds differently, which on
# a real model can change which tokens are sampled and so every record after.
COMMON = ["logging.tensorboard=false", "logging.console=false", "model.threads=1", "loop.eval_before=false",
          "loop.eval_prompts=1", "loop.save_every=0", "loop.samples_per_step=0", "model.cpu_matmul=mkl"]
RUNS = {
    "tiny_count_a": ["model.name=tiny-random", "task.name=count-a", "loop.steps=5", "trainer.lr=1e-3",
                     "run.seed=7"],
    # The batch-assembly paths: KL as a reward, overlong filter and penalty, dynamic sampling, PPO reuse.
    "tiny_shaping": ["model.name=tiny-random", "task.name=count-a", "loop.steps=4", "trainer.lr=1e-3",
                     "run.seed=1", "algorithm.beta=0.05", "algorithm.kl_mode=reward", "algorithm.kl_estimator=k1",
                     "algorithm.overlong_filter=true", "algorithm.overlong_buffer_frac=0.25",
                     "algorithm.dynamic_sampling=true", "loop.num_iterations=2", "sampling.max_tokens=12"],
    # KL in the loss (every sequence trained), TIS and high-entropy token weights.
    "tiny_kl_loss": ["model.name=tiny-random", "task.name=count-a", "loop.steps=4", "trainer.lr=1e-3",
                     "run.seed=2", "algorithm.beta=0.1", "algorithm.is_correction=truncate",
                     "algorithm.token_weighting=high_entropy", "algorithm.aggregation=seq-mean-token-mean"],
    "default_json_extract": ["task.name=json-extract", "loop.steps=3", "run.seed=0"],
}
TIMING = ("time/", "perf/")


def train_records(name: str) -> list[dict]:
    from posttrain.config import load_config
    from posttrain.loop import train
    from posttrain.obs import read_metrics

    with tempfile.TemporaryDirectory() as d:
        cfg = load_config(None, COMMON + RUNS[name] + [f"run.output_dir={d}"])
        res = train(cfg)
        return [{k: v for k, v in r.items() if not k.startswith(TIMING)}
                for r in read_metrics(str(res.run_dir)) if r["kind"] == "train"]


def reference(name: str) -> list[dict]:
    return json.loads((REF_DIR / f"{name}.json").read_text())


def differences(got: list[dict], want: list[dict], rel: float = 1e-5, abs_: float = 1e-6) -> list[str]:
    """What differs between two lists of train records, one line each; empty when they match."""
    if len(got) != len(want):
        return [f"{len(got)} records, the reference has {len(want)}"]
    out = []
    for i, (g, w) in enumerate(zip(got, want)):
        for key in sorted(set(g) ^ set(w)):
            out.append(f"record {i}: {key} only in {'the run' if key in g else 'the reference'}")
        for key in sorted(set(g) & set(w)):
            a, b = g[key], w[key]
            floats = isinstance(a, float) or isinstance(b, float)
            if floats and isinstance(a, (int, float)) and isinstance(b, (int, float)):
                if abs(a - b) > max(abs_, rel * max(abs(a), abs(b))):
                    out.append(f"record {i}: {key} = {a!r}, reference {b!r}")
            elif a != b:
                out.append(f"record {i}: {key} = {a!r}, reference {b!r}")
    return out


def main(argv: list[str]) -> int:
    mode = argv[1] if len(argv) > 1 else "check"
    names = argv[2:] or list(RUNS)
    bad = 0
    for name in names:
        recs = train_records(name)
        if mode == "write":
            REF_DIR.mkdir(parents=True, exist_ok=True)
            (REF_DIR / f"{name}.json").write_text(json.dumps(recs, indent=1, sort_keys=True))
            print(f"wrote {name}: {len(recs)} records")
        else:
            diff = differences(recs, reference(name))
            bad += bool(diff)
            print(f"{name}: {'matches' if not diff else 'DIFFERENT'}")
            for line in diff:
                print("  " + line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
