"""bench/gpu.py stays runnable without a GPU (its shapes shrunk): the architecture file loads and every
measurement returns a positive number."""

import importlib.util
from pathlib import Path

import torch

_spec = importlib.util.spec_from_file_location("gpu_bench", Path(__file__).resolve().parents[2] / "bench" / "gpu.py")
gpu = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu)


def test_gpu_bench_smoke_on_cpu():
    model, cfg = gpu.build_model("cpu", torch.float32, small=True)
    full, _ = gpu.build_model("meta", torch.float32, small=False)  # the shipped architecture, no memory used
    assert sum(p.numel() for p in full.parameters()) > 130e6  # SmolLM2-135M
    v = cfg.vocab_size
    assert gpu.bench_sampler(model, v, batch=4, new_tokens=6, prompt_len=5, device="cpu") > 0
    assert gpu.bench_trainer(model, v, n_seqs=4, prompt_len=5, new_tokens=6, device="cpu", chunk=4) > 0
    assert gpu.bench_grpo_step(model, v, n_prompts=1, g=4, prompt_len=5, new_tokens=6, device="cpu", chunk=0) > 0
