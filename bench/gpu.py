"""GPU benchmark that needs no network and no weights: the default model's architecture with random weights.

    python bench/gpu.py                        # on a CUDA machine: the full table
    python bench/gpu.py --device cpu --small   # a smoke run anywhere (tiny shapes; what CI runs)

The architecture comes from configs/smollm2_135m_architecture.json (SmolLM2-135M-Instruct's config, shipped in
the repository) with random weights: a machine without network or model files can run it. EOS is ignored,
so every completion is exactly --new-tokens long and the work is fixed. Measures:

- sampler tokens/s (posttrain's HFSampler: prefix sharing, in-place KV cache) at batch 64 and 256
- trainer tokens/s: forward_backward + optim_step over 64 sequences of prompt + new tokens
- one GRPO step of 64 completions x 256 tokens (16 prompts x G=4): sample + score + train, seconds
- TRL's GRPOTrainer on the same shapes, when `trl` is importable (same model, a constant reward)

With `--engine vllm`, vLLM's rows follow the own engine's (the same random model, written to a temporary HF folder
without a tokenizer: the engine starts with skip_tokenizer_init, token ids in and out): engine start, tokens/s at
the same batches and lengths (EOS ignored) and one full-weight push (EngineWeights.push, the trainer's tensors
reloaded in place), in <stem>_vllm.{json,md}. vLLM runs eager unless `--vllm-compile` (vLLM's own default:
torch.compile and CUDA graphs, minutes to start). Without vLLM installed it says so and stops after the own
engine's table; on a CPU it runs vLLM's CPU build (`--device cpu --small --engine vllm` is the smoke run).

With `--weight-group`, the weights of the same model, in bf16, pushed through posttrain's weight group
(sampling/weight_transfer.py, what vLLM servers and Ray actors on other hosts receive): the trainer (rank 0) and a
receiver process (rank 1) that loads every tensor into its own copy on its GPU. Two or more GPUs: NCCL, the
receiver on the second GPU. One GPU: NCCL needs a GPU per rank, so the group is gloo and the receiver copies to the
same GPU (the CPU path, with the host-to-device copy). Rows: seconds per push (median of 5) and GB/s.

Prints a markdown table and writes bench/results/gpu.{json,md}. Reference on an H200 with plain transformers and
TRL 1.16 (from the scale-out issue): HF generate 941 tok/s at batch 64 and 3,736 at 256; TRL GRPO 9.7 s per
64 x 256 step.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
ARCH = ROOT / "configs" / "smollm2_135m_architecture.json"
RESULTS = ROOT / "bench" / "results"


class NullTokenizer:
    """Enough of a tokenizer for the sampler: ids in, no text out."""

    pad_token_id = 0
    eos_token_id = 2

    def decode(self, ids, skip_special_tokens=True):
        return ""


def build_model(device: str, dtype: torch.dtype, small: bool):
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(**{k: v for k, v in json.loads(ARCH.read_text()).items() if k != "model_type"},
                               model_type="llama")
    if small:
        cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size = 2, 64, 128
        cfg.num_attention_heads, cfg.num_key_value_heads, cfg.vocab_size = 4, 2, 1024
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation="sdpa")
    return model.to(device).eval(), cfg


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def prompts(n: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(10, vocab, (n, length), generator=g).tolist()


def bench_sampler(model, vocab: int, batch: int, new_tokens: int, prompt_len: int, device: str,
                  graphs: bool = False) -> float:
    from posttrain.sampling.hf_sampler import HFSampler
    from posttrain.types import SampleParams

    s = HFSampler(model, NullTokenizer(), stop_token_ids=[-1], max_batch=batch, graphs=graphs)  # -1: no stop token
    params = SampleParams(max_tokens=new_tokens, temperature=1.0)
    # warm-up; with graphs at the timed shapes, so the compile and the capture are not timed
    s.sample_sync(prompts(batch, prompt_len, vocab, seed=1),
                  params if graphs else SampleParams(max_tokens=4, temperature=1.0))
    sync(device)
    t0 = time.perf_counter()
    out = s.sample_sync(prompts(batch, prompt_len, vocab), params)
    sync(device)
    n = sum(len(c.token_ids) for row in out for c in row)
    return n / (time.perf_counter() - t0)


def random_batch(n_prompts: int, g: int, prompt_len: int, new_tokens: int, vocab: int):
    from posttrain.types import Batch, Sequence

    seqs = []
    for gi, p in enumerate(prompts(n_prompts, prompt_len, vocab, seed=2)):
        for j, c in enumerate(prompts(g, new_tokens, vocab, seed=100 + gi)):
            seqs.append(Sequence(p, c, [1] * new_tokens, [-1.0] * new_tokens, advantage=(-1.0) ** j, group_id=gi))
    return Batch(seqs)


def bench_trainer(model, vocab: int, n_seqs: int, prompt_len: int, new_tokens: int, device: str,
                  chunk: int) -> float:
    from posttrain.algos import LOSSES, LossParams
    from posttrain.training.trainer import Trainer

    tr = Trainer(model, pad_id=0, lr=1e-6, micro_batch_tokens=16384, logits_chunk_tokens=chunk)
    batch = random_batch(n_seqs // 4, 4, prompt_len, new_tokens, vocab)
    tr.forward_backward(batch, LOSSES["ppo_clip"], LossParams())  # warm-up
    tr.optim_step()
    sync(device)
    t0 = time.perf_counter()
    tr.forward_backward(batch, LOSSES["ppo_clip"], LossParams())
    tr.optim_step()
    sync(device)
    return batch.num_tokens / (time.perf_counter() - t0)


def bench_grpo_step(model, vocab: int, n_prompts: int, g: int, prompt_len: int, new_tokens: int, device: str,
                    chunk: int, graphs: bool = False) -> float:
    """Sample G per prompt, score (a constant-cost reward), build the batch, train: one GRPO step."""
    from posttrain.algos import LOSSES, LossParams
    from posttrain.loop.batch import BatchOptions, build_batch
    from posttrain.sampling.hf_sampler import HFSampler
    from posttrain.training.trainer import Trainer
    from posttrain.types import SampleParams, Sequence

    sampler = HFSampler(model, NullTokenizer(), stop_token_ids=[-1], max_batch=n_prompts * g, graphs=graphs)
    tr = Trainer(model, pad_id=0, lr=1e-6, micro_batch_tokens=16384, logits_chunk_tokens=chunk)
    ps = prompts(n_prompts, prompt_len, vocab, seed=3)

    def step() -> None:
        out = sampler.sample_sync(ps, SampleParams(max_tokens=new_tokens, temperature=1.0), n=g)
        seqs = [Sequence(p, c.token_ids, [1] * len(c.token_ids), c.logprobs, group_id=i,
                         reward=float(sum(c.token_ids) % 7))  # a reward that varies within a group
                for i, (p, row) in enumerate(zip(ps, out)) for c in row]
        batch, _ = build_batch(seqs, BatchOptions())
        tr.forward_backward(batch, LOSSES["ppo_clip"], LossParams())
        tr.optim_step()

    step()  # warm-up
    sync(device)
    t0 = time.perf_counter()
    step()
    sync(device)
    return time.perf_counter() - t0


def bench_trl(model_cfg, n_prompts: int, g: int, prompt_len: int, new_tokens: int, device: str) -> float | None:
    try:
        import trl  # noqa: F401
        from datasets import Dataset
        from transformers import AutoModelForCausalLM
        from trl import GRPOConfig, GRPOTrainer
    except ImportError:
        return None
    import tempfile

    model = AutoModelForCausalLM.from_config(model_cfg).to(device)
    ds = Dataset.from_list([{"prompt": [{"role": "user", "content": "x " * prompt_len}]}] * (n_prompts * 3))

    class Tok(NullTokenizer):  # TRL needs a real tokenizer; skip when none can be built offline
        pass

    try:
        from transformers import PreTrainedTokenizerFast
        from tokenizers import Tokenizer, models, pre_tokenizers

        raw = Tokenizer(models.WordLevel({"[PAD]": 0, "[UNK]": 1, "x": 5}, unk_token="[UNK]"))
        raw.pre_tokenizer = pre_tokenizers.Whitespace()
        tok = PreTrainedTokenizerFast(tokenizer_object=raw, pad_token="[PAD]", unk_token="[UNK]", eos_token="[UNK]")
        tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    except Exception:  # noqa: BLE001
        return None
    times: list[float] = []
    from transformers import TrainerCallback

    class Timer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.t0 = time.perf_counter()

        def on_step_end(self, *a, **k):
            sync(device)
            times.append(time.perf_counter() - self.t0)

    with tempfile.TemporaryDirectory() as d:
        args = GRPOConfig(output_dir=d, per_device_train_batch_size=n_prompts * g, num_generations=g,
                          max_completion_length=new_tokens, max_steps=3, logging_steps=1, report_to=[],
                          bf16=device.startswith("cuda"), use_cpu=not device.startswith("cuda"), save_strategy="no")
        trainer = GRPOTrainer(model=model, reward_funcs=[lambda completions, **k: [1.0] * len(completions)],
                              args=args, train_dataset=ds, processing_class=tok, callbacks=[Timer()])
        trainer.train()
    return min(times[1:] or times) if times else None


VLLM_MISSING = ("vLLM is not installed on this machine: the vLLM rows would need `pip install vllm==0.32.0` "
                "(326 MB wheel + CUDA torch), which cannot travel in the 64 MiB tree")


class _NoTokenizerFiles:
    """write_model_folder's tokenizer: the engine starts with skip_tokenizer_init, so no tokenizer files."""

    def save_pretrained(self, d) -> None:
        pass


def bench_vllm(model, vocab: int, batches, new_tokens: int, prompt_len: int, device: str, dtype: torch.dtype,
               compile_: bool, pushes: int = 3) -> list[tuple[str, float]] | str:
    """vLLM in this process on the same model: start, tok/s per batch, full-weight push; a string (why not) where
    vLLM cannot be imported."""
    import statistics
    import tempfile

    try:
        from posttrain.sampling.vllm_engine import EngineSpec, VLLMSampler, VLLMUnavailable, import_vllm

        vllm = import_vllm()
    except (ImportError, VLLMUnavailable) as e:
        return f"{VLLM_MISSING} ({type(e).__name__}: {str(e).splitlines()[0][:200]})"
    from posttrain.sampling.vllm_weights import EngineWeights, write_model_folder
    from vllm.inputs import TokensPrompt

    kind = "GPU" if device.startswith("cuda") else "CPU"
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    rows: list[tuple[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="gpu_vllm_") as d:
        folder = write_model_folder(model, _NoTokenizerFiles(), Path(d) / "model")
        spec = EngineSpec(model_dir=str(folder), dtype=str(dtype).removeprefix("torch."), seed=0,
                          max_model_len=prompt_len + new_tokens + 16, kv_cache_gb=8.0 if kind == "GPU" else 0.5,
                          compile=compile_, extra={"skip_tokenizer_init": True, "max_num_seqs": max(batches)})
        t0 = time.perf_counter()
        engine = VLLMSampler(spec, NullTokenizer(), stop_token_ids=[], log=lambda s: None)
        mode = "compiled" if compile_ else "eager"
        rows.append((f"vLLM {vllm.__version__} ({kind} build, {mode}) start s", time.perf_counter() - t0))

        def generate(ps: list[list[int]], n_new: int) -> int:
            sp = vllm.SamplingParams(max_tokens=n_new, temperature=1.0, ignore_eos=True, logprobs=0,
                                     detokenize=False)
            with engine._engine_threads():
                outs = engine.llm.generate([TokensPrompt(prompt_token_ids=p) for p in ps], sp, use_tqdm=False)
            return sum(len(o.token_ids) for r in outs for o in r.outputs)

        try:
            for b in batches:
                generate(prompts(b, prompt_len, vocab, seed=1), 4)  # warm-up, as the own sampler's
                sync(device)
                t0 = time.perf_counter()
                n = generate(prompts(b, prompt_len, vocab), new_tokens)
                sync(device)
                tok_s = n / (time.perf_counter() - t0)
                rows.append((f"vLLM tok/s, batch {b}, {new_tokens} new tokens ({mode})", tok_s))
            push = EngineWeights(model, engine)
            times = []
            for v in range(1, pushes + 1):
                sync(device)
                times.append(push.push(v)["time/weight_sync"])
            mb = sum(p.numel() * p.element_size() for p in model.parameters()) / 1e6
            rows.append((f"vLLM full-weight push s ({mb:,.0f} MB, median of {pushes})", statistics.median(times)))
        finally:
            engine.close()
    return rows


def _group_receiver(port: int, backend: str, device: str, layout: str, repeats: int, q) -> None:
    from posttrain.sampling import weight_transfer as wt

    specs, buckets, _ = wt.parse_layout(layout)
    store = wt.open_store("127.0.0.1", port, 2, 1, 300)
    group = wt.open_group(backend, store, "bench", 1, 2, 300)
    into = {s.name: torch.empty(s.shape, dtype=getattr(torch, s.dtype), device=device) for s in specs}
    recv_dev = device if backend == "nccl" else "cpu"
    for _ in range(repeats):
        for name, t in wt.iter_received(group, specs, buckets, recv_dev):
            into[name].copy_(t, non_blocking=True)
        sync(device)
        q.put("done")


def bench_weight_group(model, device: str, repeats: int = 5) -> list[tuple[str, float]]:
    """Seconds per push of the model's weights (bf16) through the weight group to another process (docstring)."""
    import multiprocessing as mp
    import statistics

    from posttrain.sampling import weight_transfer as wt

    gpus = torch.cuda.device_count() if device.startswith("cuda") else 0
    backend, recv_device = ("nccl", "cuda:1") if gpus >= 2 else ("gloo", device)
    state = {n: p.detach() for n, p in model.named_parameters()}
    specs = wt.engine_specs(state, "bfloat16")
    buckets = wt.plan_buckets(specs, 64 * 2**20)
    flat = wt.FlatWeights(specs)
    store = wt.open_store("127.0.0.1", 0, 2, 0, 300)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    proc = ctx.Process(target=_group_receiver, args=(store.port, backend, recv_device,
                                                     wt.layout_json(specs, buckets), repeats, q))
    proc.start()
    group = wt.open_group(backend, store, "bench", 0, 2, 300)
    send_device = device if backend == "nccl" else "cpu"
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        flat.fill(state)  # the cast into the flat copy is part of every push
        wt.send_flat(group, flat.data, buckets, send_device)
        q.get(timeout=600)
        times.append(time.perf_counter() - t0)
    proc.join(timeout=60)
    flat.close()
    med = statistics.median(times)
    gb = wt.total_bytes(specs) / 1e9
    return [(f"weight group push s ({backend}, bf16, {gb:.2f} GB, to {recv_device})", med),
            (f"weight group GB/s ({backend})", gb / med)]


def fmt(k: str, v: float) -> str:
    """One decimal, as ever; vLLM's and the weight group's rows (push seconds, ratios) get three below 10."""
    return f"{v:.3f}" if k.startswith(("vLLM", "weight group")) and abs(v) < 10 else f"{v:,.1f}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--small", action="store_true", help="tiny shapes and model: a smoke run")
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--chunk", type=int, default=0, help="trainer.logits_chunk_tokens")
    ap.add_argument("--no-trl", action="store_true")
    ap.add_argument("--graphs", action="store_true", help="also measure the CUDA-graph decode (sampling.cuda_graphs)")
    ap.add_argument("--engine", choices=("own", "vllm"), default="own",
                    help="vllm: also vLLM in process on the same model (start, tok/s, full-weight push)")
    ap.add_argument("--vllm-compile", action="store_true", help="vLLM with torch.compile + CUDA graphs (not eager)")
    ap.add_argument("--weight-group", action="store_true", help="also push the weights through the weight group")
    args = ap.parse_args()
    dev = args.device
    dtype = torch.bfloat16 if dev.startswith("cuda") else torch.float32
    new = 8 if args.small else args.new_tokens
    plen = 8 if args.small else args.prompt_len
    batches = (4, 8) if args.small else (64, 256)
    model, cfg = build_model(dev, dtype, args.small)
    rows = []
    for b in batches:
        rows.append((f"sampler tok/s, batch {b}, {new} new tokens", bench_sampler(model, cfg.vocab_size, b, new, plen, dev)))
    n = batches[0]
    rows.append((f"trainer tok/s, {n} x ({plen} + {new})", bench_trainer(model, cfg.vocab_size, n, plen, new, dev,
                                                                         args.chunk)))
    rows.append((f"GRPO step s, {n // 4} prompts x G=4 x {new}", bench_grpo_step(model, cfg.vocab_size, n // 4, 4,
                                                                                   plen, new, dev, args.chunk)))
    if args.graphs:
        for b in batches:
            rows.append((f"sampler tok/s, batch {b}, {new} new tokens, CUDA graphs",
                         bench_sampler(model, cfg.vocab_size, b, new, plen, dev, graphs=True)))
        rows.append((f"GRPO step s, {n // 4} prompts x G=4 x {new}, CUDA graphs",
                     bench_grpo_step(model, cfg.vocab_size, n // 4, 4, plen, new, dev, args.chunk, graphs=True)))
    if not args.no_trl:
        t = bench_trl(cfg, n // 4, 4, plen, new, dev)
        rows.append(("TRL GRPOTrainer step s, same shapes", t if t is not None else float("nan")))
        if t is not None:
            steps = [v for k, v in rows if k.startswith("GRPO step s")]
            rows.append(("TRL step / posttrain step (>1: posttrain faster)", t / steps[0]))
            if len(steps) > 1:
                rows.append(("TRL step / posttrain step with CUDA graphs", t / steps[1]))
    if args.weight_group:
        rows += bench_weight_group(model, dev)
    missing = None
    if args.engine == "vllm":
        vllm_rows = bench_vllm(model, cfg.vocab_size, batches, new, plen, dev, dtype, args.vllm_compile)
        if isinstance(vllm_rows, str):  # not installed: the own engine's table alone, then why
            missing, args.engine = vllm_rows, "own"
        else:
            rows += vllm_rows
            for b in batches:
                own = next(v for k, v in rows if k.startswith(f"sampler tok/s, batch {b},"))
                vl = next(v for k, v in vllm_rows if k.startswith(f"vLLM tok/s, batch {b},"))
                rows.append((f"vLLM / own sampler tok/s, batch {b}", vl / own))
    name = torch.cuda.get_device_name(0) if dev.startswith("cuda") else f"CPU ({os.cpu_count()} cores)"
    md = [f"bench/gpu.py on {name}, {dtype}, random weights of {ARCH.name}{' (small)' if args.small else ''}", "",
          "| measure | value |", "|---|---:|"] + [f"| {k} | {fmt(k, v)} |" for k, v in rows]
    print("\n".join(md))
    RESULTS.mkdir(exist_ok=True)
    stem = ("gpu_small" if args.small else "gpu") + ("_vllm" if args.engine == "vllm" else "")
    (RESULTS / f"{stem}.md").write_text("\n".join(md) + "\n")
    (RESULTS / f"{stem}.json").write_text(json.dumps({"device": name, "rows": dict(rows)}, indent=2))
    if missing:
        print(missing)


if __name__ == "__main__":
    main()
