"""Peak memory and seconds of one training step: full logits vs the chunked output projection, and activation
checkpointing on top.

    python bench/logits_memory.py [--model default] [--seqs 16] [--prompt 120] [--completion 128] [--chunk 1024]

Each configuration (full fine-tune / LoRA x chunk off / on / on with trainer.gradient_checkpointing) runs in a
fresh process: load the model, one
forward_backward + optim_step on a random batch of `seqs` sequences (4 groups), report peak RSS (ru_maxrss)
and the step's seconds. The default model's vocabulary is 49,152 wide: full logits for 16 x 128 completion
tokens are 16 * 128 * 49152 * 4 bytes = 403 MB, plus the same again for log-softmax and its gradient.
Writes bench/results/logits_memory.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

from posttrain.obs.memory import peak_rss_mb  # ru_maxrss in MB on Linux and macOS

RESULTS = Path(__file__).resolve().parent / "results"


def one(model_name: str, lora: bool, chunk: int, seqs: int, prompt: int, completion: int, ckpt: bool = False) -> dict:
    import torch

    from posttrain.algos import LOSSES, LossParams
    from posttrain.models import load_model
    from posttrain.models.lora import apply_lora
    from posttrain.training.trainer import Trainer
    from posttrain.types import Batch, Sequence

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    model, tok = load_model(model_name, log=lambda s: None)
    if lora:
        model = apply_lora(model, r=16, alpha=32.0, dropout=0.0,
                           target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    base_rss = peak_rss_mb()
    rng = random.Random(0)
    vocab = model.config.vocab_size
    groups = 4
    out = []
    for g in range(groups):
        p = [rng.randrange(10, vocab) for _ in range(prompt)]
        for _ in range(seqs // groups):
            out.append(Sequence(p, [rng.randrange(10, vocab) for _ in range(completion)], [1] * completion,
                                [-1.0] * completion, advantage=rng.gauss(0, 1), group_id=g))
    tr = Trainer(model, pad_id=tok.pad_token_id or 0, micro_batch_tokens=10**6, logits_chunk_tokens=chunk,
                 gradient_checkpointing=ckpt)
    t0 = time.perf_counter()
    tr.forward_backward(Batch(out), LOSSES["ppo_clip"], LossParams())
    tr.optim_step()
    dt = time.perf_counter() - t0
    peak = peak_rss_mb()
    return {"lora": lora, "chunk": chunk, "ckpt": ckpt, "seconds": dt, "peak_rss_mb": peak,
            "after_load_rss_mb": base_rss}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="default")
    ap.add_argument("--seqs", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=120)
    ap.add_argument("--completion", type=int, default=128)
    ap.add_argument("--chunk", type=int, default=1024)
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: run one config in this process
    args = ap.parse_args()
    if args.one:
        lora, chunk, ckpt = args.one.split(",")
        print(json.dumps(one(args.model, lora == "1", int(chunk), args.seqs, args.prompt, args.completion,
                             ckpt == "1")))
        return
    rows = []
    for lora in (0, 1):
        for chunk, ckpt in ((0, 0), (args.chunk, 0), (args.chunk, 1)):
            cmd = [sys.executable, __file__, "--model", args.model, "--seqs", str(args.seqs), "--prompt",
                   str(args.prompt), "--completion", str(args.completion), "--one", f"{lora},{chunk},{ckpt}"]
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
            if res.returncode != 0:
                raise SystemExit(res.stderr[-2000:])
            rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
            r = rows[-1]
            print(f"{'LoRA' if lora else 'full'} chunk={chunk:<5} checkpointing={ckpt} peak RSS {r['peak_rss_mb']:7.0f} MB "
                  f"(after load {r['after_load_rss_mb']:.0f})  step {r['seconds']:.1f} s", flush=True)
    md = ["| fine-tune | logits | activation checkpointing | peak RSS MB | step s |", "|---|---|---|---:|---:|"]
    md += [f"| {'LoRA r=16' if r['lora'] else 'full'} | {'chunked ' + str(r['chunk']) if r['chunk'] else 'full'} | "
           f"{'on' if r['ckpt'] else 'off'} | {r['peak_rss_mb']:.0f} | {r['seconds']:.1f} |" for r in rows]
    RESULTS.mkdir(exist_ok=True)
    meta = {"model": args.model, "seqs": args.seqs, "prompt": args.prompt, "completion": args.completion,
            "load_avg": os.getloadavg()}
    (RESULTS / "logits_memory.json").write_text(json.dumps({**meta, "rows": rows}, indent=2))
    (RESULTS / "logits_memory.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
