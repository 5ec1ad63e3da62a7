"""fp32 Linear layers through MKL (torch's default) vs oneDNN (`model.cpu_matmul=onednn`), on the default model.

    python bench/matmul.py [--threads 2] [--repeats 3] [--batch 16] [--tokens 214]

Two measurements, each best of --repeats:
- the Linear shapes of one token step of decode at --batch rows (every layer's seven projections and the output
  projection), ms per token step, plain `F.linear` vs `torch.ops.mkldnn._linear_pointwise`;
- a forward and backward of the whole default model (full fine-tune, full-vocabulary log-softmax loss) on
  --batch x --tokens tokens, seconds, with the model's Linears routed to MKL and to oneDNN, and the largest
  relative difference of the gradients between the two.
`--ops` instead times each product of one Linear's training pass (forward, input gradient, weight gradient) for
each distinct Linear shape of the default model at --batch x --tokens rows, MKL vs oneDNN: where `auto`'s
training choice comes from (on an AVX2 EPYC oneDNN's weight gradient ran at 0.57-0.97x MKL's speed).
Prints a table with the CPU it ran on; writes bench/results/matmul.{json,md} (or matmul_ops.{json,md}).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"


def best_of(fn, repeats: int) -> float:
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def decode_shapes(model) -> list[tuple[int, int]]:
    return [tuple(m.weight.shape) for m in model.modules() if isinstance(m, torch.nn.Linear)]


def per_op(shapes, rows: int, repeats: int) -> list[dict]:
    """ms per product of a Linear's training pass, for each [out, in] weight shape, MKL (plain matmuls, what
    F.linear and its autograd run) vs oneDNN (what models/matmul.OneDNNLinear runs)."""
    lp = torch.ops.mkldnn._linear_pointwise
    out = []
    for n, k in sorted(set(shapes)):
        x, w, g = torch.randn(rows, k), torch.randn(n, k), torch.randn(rows, n)
        ops = {"forward": (lambda: torch.nn.functional.linear(x, w), lambda: lp(x, w, None, "none", [], "")),
               "input gradient": (lambda: g @ w, lambda: lp(g, w.t(), None, "none", [], "")),
               "weight gradient": (lambda: g.t() @ x, lambda: lp(g.t(), x.t(), None, "none", [], ""))}
        for op, (mkl, dnn) in ops.items():
            out.append({"shape": [n, k], "op": op, "mkl_ms": best_of(mkl, repeats) * 1e3,
                        "onednn_ms": best_of(dnn, repeats) * 1e3})
    return out


def auto_choice() -> str:
    from posttrain.models.matmul import CPULinear, linear_class

    cls = linear_class("auto")
    return {CPULinear: "oneDNN for decode and training", torch.nn.Linear: "MKL for everything"}.get(
        cls, "oneDNN for decode, MKL for training")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--tokens", type=int, default=214)
    p.add_argument("--results", default=str(RESULTS))
    p.add_argument("--ops", action="store_true", help="per-product training timings per Linear shape instead")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)

    from posttrain.models import load_model
    from posttrain.models.matmul import route_linears_
    from posttrain.obs.machine import cpu_line, cpu_summary

    model, _ = load_model("default", log=lambda s: None)
    if args.ops:
        rows = per_op(decode_shapes(model), args.batch * args.tokens, args.repeats)
        lines = [f"one Linear's training products at {args.batch * args.tokens} rows, default model's shapes, "
                 f"{args.threads} threads, best of {args.repeats}; CPU: {cpu_line()}", "",
                 "| weight [out, in] | product | MKL ms | oneDNN ms | oneDNN speed-up |", "|---|---|---:|---:|---:|"]
        lines += [f"| {r['shape']} | {r['op']} | {r['mkl_ms']:.1f} | {r['onednn_ms']:.1f} | "
                  f"{r['mkl_ms'] / r['onednn_ms']:.2f}x |" for r in rows]
        lines += ["", f"model.cpu_matmul=auto here: {auto_choice()}"]
        md = "\n".join(lines)
        print(md)
        out = Path(args.results)
        out.mkdir(parents=True, exist_ok=True)
        (out / "matmul_ops.json").write_text(json.dumps({"args": vars(args), "cpu": cpu_summary(), "ops": rows},
                                                        indent=1))
        (out / "matmul_ops.md").write_text("# bench/matmul.py --ops\n\n" + md + "\n")
        return
    weights = [torch.randn(*shape) * 0.02 for shape in decode_shapes(model)]
    xs = {k: torch.randn(args.batch, k) for k in {w.shape[1] for w in weights}}
    lp = torch.ops.mkldnn._linear_pointwise
    decode = {
        "mkl": best_of(lambda: [torch.nn.functional.linear(xs[w.shape[1]], w) for w in weights], args.repeats),
        "onednn": best_of(lambda: [lp(xs[w.shape[1]], w, None, "none", [], "") for w in weights], args.repeats),
    }
    print(f"decode Linears, {args.batch} rows: MKL {decode['mkl'] * 1e3:.1f} ms, oneDNN {decode['onednn'] * 1e3:.1f} ms",
          flush=True)

    x = torch.randint(5, model.config.vocab_size, (args.batch, args.tokens), generator=torch.Generator().manual_seed(0))
    model.train()
    grads = {}

    def step():
        model.zero_grad(set_to_none=True)
        logits = model(x, use_cache=False).logits
        logits.float().log_softmax(-1).gather(-1, x[..., None]).mean().backward()

    train = {}
    for setting in ("mkl", "onednn"):
        route_linears_(model, setting)
        train[setting] = best_of(step, args.repeats)
        grads[setting] = {n: q.grad.clone() for n, q in model.named_parameters() if ".layers.0." in n or "embed" in n}
        print(f"forward+backward via {setting}: {train[setting]:.2f} s", flush=True)
    rel = max(((grads["mkl"][n] - grads["onednn"][n]).abs().max() / grads["mkl"][n].abs().max()).item()
              for n in grads["mkl"])
    lines = [f"default model, {args.threads} threads, best of {args.repeats}; CPU: {cpu_line()}", "",
             "| work | MKL | oneDNN | speed-up |", "|---|---:|---:|---:|",
             f"| decode: every Linear of one token step, {args.batch} rows | {decode['mkl'] * 1e3:.1f} ms | "
             f"{decode['onednn'] * 1e3:.1f} ms | {decode['mkl'] / decode['onednn']:.2f}x |",
             f"| forward + backward, {args.batch} x {args.tokens} tokens | {train['mkl']:.2f} s | "
             f"{train['onednn']:.2f} s | {train['mkl'] / train['onednn']:.2f}x |", "",
             f"largest relative gradient difference (layer 0 and embeddings): {rel:.1e}", "",
             f"model.cpu_matmul=auto here: {auto_choice()}"]
    md = "\n".join(lines)
    print("\n" + md)
    out = Path(args.results)
    out.mkdir(parents=True, exist_ok=True)
    (out / "matmul.json").write_text(json.dumps({"args": vars(args), "cpu": cpu_summary(), "decode_s": decode,
                                                 "train_s": train, "grad_rel_diff": rel}, indent=1))
    (out / "matmul.md").write_text("# bench/matmul.py\n\n" + md + "\n")


if __name__ == "__main__":
    main()
