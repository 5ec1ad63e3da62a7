"""CPU fp32 matmuls of Linear layers through oneDNN instead of MKL (`model.cpu_matmul`).

torch sends an fp32 `F.linear` on the CPU to MKL's sgemm. MKL is tuned for Intel's CPUs, and on the
AMD EPYC reference machines oneDNN's inner product (which torch already ships for bf16 and convolutions) was
much faster on the default model's shapes (`python bench/matmul.py`, 2 threads, an AVX-512 EPYC, 2026-12-02;
bench/results/matmul.md):

- decode, 16 rows by every Linear of a token step: 59.2 ms through MKL, 32.0 ms through oneDNN
- a forward and backward of the default model on 16 x 214 tokens: 19.9 s vs 12.7 s

`route_linears_(model, setting)` turns every plain `nn.Linear` of a model into a `CPULinear` (the same module,
class swapped: same parameters, state dict, LoRA wrapping and FSDP sharding). Its forward runs `OneDNNLinear` on
plain fp32 CPU tensors: forward and input gradient by oneDNN's inner product, weight gradient by oneDNN on the
transposed views (which it takes as contiguous copies: about 14% of an update in a profile), bias gradient a sum. Anything else (bf16, CUDA, DTensor shards) takes `F.linear`
as before. Results equal MKL's to fp32 rounding (tests/models/test_matmul.py compares outputs and gradients).

A class swap rather than a global switch: only the modules of the run's model change, both the trainer and the
sampler that shares them see it, and a checkpointed layer's replay takes the same path as its first run.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import torch

_lp = torch.ops.mkldnn._linear_pointwise  # (input, weight [out, in], bias, "none", [], "") -> input @ weight.T + b
SETTINGS = ("auto", "onednn", "mkl")


class OneDNNLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return _lp(x, weight, bias, "none", [], "")

    @staticmethod
    def backward(ctx, g):
        x, weight = ctx.saved_tensors
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            gx = _lp(g, weight.t(), None, "none", [], "")  # g @ W: W.T is the [in, out] "weight" of that product
        if ctx.needs_input_grad[1] or (ctx.has_bias and ctx.needs_input_grad[2]):
            g2 = g.reshape(-1, g.shape[-1])
            if ctx.needs_input_grad[1]:
                gw = _lp(g2.t(), x.reshape(-1, x.shape[-1]).t(), None, "none", [], "")  # g.T @ x
            if ctx.has_bias and ctx.needs_input_grad[2]:
                gb = g2.sum(0)
        return gx, gw, gb


def _plain_cpu_fp32(t: Any) -> bool:
    # Exact types: a tensor subclass (a DTensor shard, a fake or meta tensor) keeps its own dispatch.
    return type(t) in (torch.Tensor, torch.nn.Parameter) and t.dtype == torch.float32 and t.device.type == "cpu"


class CPULinear(torch.nn.Linear):
    """nn.Linear whose fp32 CPU products go through oneDNN (see the module docstring)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w, b = self.weight, self.bias
        if not (_plain_cpu_fp32(x) and _plain_cpu_fp32(w) and (b is None or _plain_cpu_fp32(b)) and x.numel()):
            return torch.nn.functional.linear(x, w, b)
        if not torch.is_grad_enabled() or not (x.requires_grad or w.requires_grad or (b is not None and b.requires_grad)):
            return _lp(x, w, b, "none", [], "")  # decode and no-grad passes: no autograd node to build
        return OneDNNLinear.apply(x, w, b)


@functools.cache
def onednn_works() -> bool:
    """Whether oneDNN's fp32 inner product runs here (tried once on a tiny layer)."""
    try:
        return bool(torch.backends.mkldnn.is_available()
                    and _lp(torch.ones(2, 4), torch.ones(3, 4), None, "none", [], "").shape == (2, 3))
    except (RuntimeError, AttributeError, NotImplementedError):
        return False


def _cpu_vendor() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("vendor_id"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def use_onednn(setting: str) -> bool:
    """`model.cpu_matmul`: "onednn", "mkl", or "auto" (oneDNN unless the CPU is Intel's, where MKL is at home)."""
    if setting not in SETTINGS:
        raise ValueError(f"model.cpu_matmul must be one of {', '.join(SETTINGS)}, not {setting!r}")
    if setting == "mkl":
        return False
    if setting == "onednn" and not onednn_works():
        raise RuntimeError("model.cpu_matmul=onednn: oneDNN's inner product does not run on this machine")
    return onednn_works() and (setting == "onednn" or _cpu_vendor() != "GenuineIntel")


def route_linears_(model: torch.nn.Module, setting: str = "auto") -> int:
    """Make every plain nn.Linear of `model` a CPULinear when `setting` picks oneDNN (or back to nn.Linear when
    it picks MKL); in place, returns how many modules use oneDNN afterwards."""
    target = CPULinear if use_onednn(setting) else torch.nn.Linear
    n = 0
    for m in model.modules():
        if type(m) in (torch.nn.Linear, CPULinear):  # exact: LoRA and quantized layers keep their own class
            m.__class__ = target
            n += target is CPULinear
    return n
