"""CPU fp32 matmuls of Linear layers through oneDNN instead of MKL (`model.cpu_matmul`).

torch sends an fp32 `F.linear` on the CPU to MKL's sgemm. MKL is tuned for Intel's CPUs, and on the
AMD EPYC reference machines oneDNN's inner product (which torch already ships for bf16 and convolutions) was
faster on the default model's shapes, by how much depending on the vector unit (`python bench/matmul.py`, 2
threads; bench/results/matmul.md and matmul_avx2.md):

| work | AVX-512 EPYC: MKL / oneDNN | AVX2 EPYC: MKL / oneDNN |
|---|---|---|
| decode, 16 rows by every Linear of a token step | 59.2 / 32.0 ms | 119.2 / 93.3 ms |
| forward and backward, 16 x 214 tokens | 19.9 / 12.7 s | 28.7 / 38.6 s |

On AVX2 oneDNN's weight gradient (a product of two transposed operands, which it copies first) ran at 0.57-0.97x
MKL's speed (`python bench/matmul.py --ops`), so training there stays on MKL. Hence two routed classes:
`CPULinear` sends every fp32 product to oneDNN, `DecodeOneDNNLinear` only passes without autograd (decode,
scoring, the reference model) and trains through `F.linear`.

`route_linears_(model, setting)` turns every plain `nn.Linear` of a model into one of them (the same module,
class swapped: same parameters, state dict, LoRA wrapping and FSDP sharding). Its forward runs `OneDNNLinear` on
plain fp32 CPU tensors: forward and input gradient by oneDNN's inner product, weight gradient by oneDNN on the
transposed views (which it takes as contiguous copies: about 14% of an update in a profile), bias gradient a
sum. Anything else (bf16, CUDA, DTensor shards) takes `F.linear` as before. Results equal MKL's to fp32
rounding (tests/models/test_matmul.py compares outputs and gradients).

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

    train_onednn = True  # False: passes that build an autograd graph take F.linear (MKL)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w, b = self.weight, self.bias
        if torch.is_autocast_enabled("cpu"):  # mixed precision (trainer.precision=bf16): autocast's bf16 matmul
            return torch.nn.functional.linear(x, w, b)
        if not (_plain_cpu_fp32(x) and _plain_cpu_fp32(w) and (b is None or _plain_cpu_fp32(b)) and x.numel()):
            return torch.nn.functional.linear(x, w, b)
        if not torch.is_grad_enabled() or not (
            x.requires_grad or w.requires_grad or (b is not None and b.requires_grad)
        ):
            return _lp(x, w, b, "none", [], "")  # decode and no-grad passes: no autograd node to build
        if not self.train_onednn:
            return torch.nn.functional.linear(x, w, b)
        return OneDNNLinear.apply(x, w, b)


class DecodeOneDNNLinear(CPULinear):
    """oneDNN for passes without autograd only; training products through MKL (AVX2 machines, see above)."""

    train_onednn = False


ROUTABLE = (torch.nn.Linear, CPULinear, DecodeOneDNNLinear)  # exact classes route_linears_ may swap between


@functools.cache
def onednn_works() -> bool:
    """Whether oneDNN's fp32 inner product runs here (tried once on a tiny layer)."""
    try:
        return bool(
            torch.backends.mkldnn.is_available()
            and _lp(torch.ones(2, 4), torch.ones(3, 4), None, "none", [], "").shape == (2, 3)
        )
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


def _avx512() -> bool:
    return torch.backends.cpu.get_cpu_capability().startswith("AVX512")


def linear_class(setting: str) -> type[torch.nn.Linear]:
    """`model.cpu_matmul` as the class a Linear gets: "onednn" (CPULinear), "mkl" (nn.Linear), or "auto": MKL on
    Intel's CPUs, where it is at home; elsewhere oneDNN for decode, and for training too where torch runs AVX-512
    kernels (on AVX2 oneDNN trains slower, see the module docstring)."""
    if setting not in SETTINGS:
        raise ValueError(f"model.cpu_matmul must be one of {', '.join(SETTINGS)}, not {setting!r}")
    if setting == "mkl":
        return torch.nn.Linear
    if setting == "onednn":
        if not onednn_works():
            raise RuntimeError("model.cpu_matmul=onednn: oneDNN's inner product does not run on this machine")
        return CPULinear
    if not onednn_works() or _cpu_vendor() == "GenuineIntel":
        return torch.nn.Linear
    return CPULinear if _avx512() else DecodeOneDNNLinear


def use_onednn(setting: str) -> bool:
    """Whether `setting` sends any product to oneDNN here."""
    return linear_class(setting) is not torch.nn.Linear


def route_linears_(model: torch.nn.Module, setting: str = "auto") -> int:
    """Give every plain nn.Linear of `model` the class `setting` picks (`linear_class`), or back to nn.Linear
    for MKL; in place, returns how many modules use oneDNN (for some pass) afterwards."""
    target = linear_class(setting)
    n = 0
    for m in model.modules():
        if type(m) in ROUTABLE:  # exact: LoRA and quantized layers keep their own class
            m.__class__ = target
            n += target is not torch.nn.Linear
    return n
