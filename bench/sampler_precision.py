"""The sampler's precision: decode speed and closeness to the fp32 policy, per `sampling.precision`.

    python bench/sampler_precision.py [--threads 2] [--batch 16] [--new-tokens 64] [--repeats 3]

For fp32 through MKL (torch's default) and through oneDNN (`model.cpu_matmul`), an fp32 copy with oneDNN-packed
weights (`sampling.packed_weights=on`), bf16 plain and packed, int8 (weight-only, what `sampling.precision=int8`
ships) and, as a measured alternative that is not shipped, torch's dynamic int8 quantization (int8 weights and
per-tensor int8 activations):
- rollout tokens/s of posttrain's sampler on json-extract prompts (4 prompts x batch/4 completions, temperature 1,
  every row decoding the full --new-tokens: no stop), best of --repeats;
- teacher-forced on 8 json-extract prompts with their reference answers: KL(fp32 || copy) per token (nats) and
  how often the copy's argmax equals fp32's.
Prints a table with the CPU it ran on (the ratios depend on its instruction set); writes
bench/results/sampler_precision.{json,md}.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
import warnings
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"


def dynamic_int8(model):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.ao.quantization.quantize_dynamic(
            copy.deepcopy(model).eval(), {torch.nn.Linear: torch.ao.quantization.per_channel_dynamic_qconfig},
            dtype=torch.qint8)


def decode_speed(m, tok, prompts, batch: int, new_tokens: int, repeats: int) -> float:
    from posttrain.sampling.hf_sampler import HFSampler
    from posttrain.types import SampleParams

    rows = [p for p in prompts for _ in range(batch // len(prompts))]
    s = HFSampler(m, tok, stop_token_ids=[-1])  # no stop token: every row decodes new_tokens
    s._sample_rows(rows[:2], SampleParams(max_tokens=4, temperature=1.0, seed=0))  # warm-up
    best = float("inf")
    for r in range(repeats):
        t0 = time.perf_counter()
        out = s._sample_rows(rows, SampleParams(max_tokens=new_tokens, temperature=1.0, seed=r))
        best = min(best, time.perf_counter() - t0)
    return sum(len(c.token_ids) for c in out) / best


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--results", default=str(RESULTS))
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)

    from posttrain.tasks.json_extract import make_task
    from posttrain.models import load_model, render_prompt
    from posttrain.obs.machine import cpu_line, cpu_summary
    from posttrain.sampling.precision import closeness, low_precision_copy

    model, tok = load_model("default", log=lambda s: None)
    model.eval()
    task = make_task()
    prompts = [render_prompt(tok, r["prompt"]) for r in task.train_rows[:4]]
    from posttrain.sampling.packed_linear import can_pack
    from posttrain.sampling.precision import refresh_

    # (name, make the sampler's model, what refresh_ is called with at a sync; None: shares the trainer's)
    from posttrain.models.matmul import route_linears_

    def routed(setting):
        route_linears_(model, setting)
        return model

    variants = [("fp32, MKL (torch's default; shares the trainer's weights)", lambda: routed("mkl"), None),
                ("fp32, oneDNN (model.cpu_matmul=onednn; shares the trainer's weights)", lambda: routed("onednn"),
                 None),
                ("fp32, oneDNN-packed copy", lambda: low_precision_copy(model, "fp32", packed=True), "fp32"),
                ("bf16, plain Linear", lambda: low_precision_copy(model, "bf16"), "bf16"),
                ("bf16, oneDNN-packed", lambda: low_precision_copy(model, "bf16", packed=True), "bf16"),
                ("int8 (weight-only)", lambda: low_precision_copy(model, "int8"), "int8"),
                ("int8 dynamic (weights + activations; not shipped)", lambda: dynamic_int8(model), None)]
    packable = {"fp32": can_pack(torch.float32), "bf16": can_pack(torch.bfloat16)}
    rows = []
    for name, make, refresh_as in variants:
        if "packed" in name and not packable[name[:4]]:
            print(f"{name}: skipped, oneDNN cannot pack {name[:4]} on this CPU", flush=True)
            continue
        m = make()
        if m is not model:
            route_linears_(model, "mkl")  # the reference for KL: the plain fp32 policy
        tps = decode_speed(m, tok, prompts, args.batch, args.new_tokens, args.repeats)
        pairs = [(r["prompt"], json.dumps(r["expected"], indent=2)) for r in task.train_rows[:8]]
        kl, agree = (0.0, 1.0) if m is model else closeness(model, m, tok, pairs)
        sync_s = 0.0
        if refresh_as is not None:
            t0 = time.perf_counter()
            refresh_(m, model, refresh_as)
            sync_s = time.perf_counter() - t0
        rows.append({"precision": name, "tokens_per_s": tps, "kl_per_token": kl, "argmax_agree": agree,
                     "refresh_s": sync_s})
        print(f"{name}: {tps:.1f} tok/s, KL {kl:.4f}, argmax agree {agree:.3f}, refresh {sync_s:.2f} s", flush=True)
        del m
    base, base_dnn = rows[0]["tokens_per_s"], rows[1]["tokens_per_s"]
    lines = [f"default model, batch {args.batch} ({len(prompts)} json-extract prompts), {args.new_tokens} new tokens, "
             f"{args.threads} threads, best of {args.repeats}; closeness teacher-forced on 8 prompts + answers; "
             "refresh: one weight sync into the copy", "", f"CPU: {cpu_line()}", "",
             "| sampler | rollout tok/s | vs fp32 MKL | vs fp32 oneDNN | KL(fp32 ‖ copy) per token | same argmax | "
             "refresh s |", "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['precision']} | {r['tokens_per_s']:.1f} | {r['tokens_per_s'] / base:.2f}x | "
                     f"{r['tokens_per_s'] / base_dnn:.2f}x | "
                     f"{r['kl_per_token']:.4f} | {r['argmax_agree']:.3f} | {r['refresh_s']:.2f} |")
    md = "\n".join(lines)
    print("\n" + md)
    out = Path(args.results)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sampler_precision.json").write_text(json.dumps({"args": vars(args), "cpu": cpu_summary(), "rows": rows}, indent=1))
    (out / "sampler_precision.md").write_text("# bench/sampler_precision.py\n\n" + md + "\n")


if __name__ == "__main__":
    main()
