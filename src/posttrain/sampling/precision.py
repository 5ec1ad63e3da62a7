"""The sampler's own low-precision copy of the policy (`sampling.precision`): fp32, bf16 or int8.

Decoding streams every weight once per generated token, so on a CPU it is bound by memory bandwidth: weights
in int8 are a quarter of the bytes of fp32. The field samples in lower precision than it trains (bf16 or FP8
vLLM samplers beside fp32 trainers; FlashRL's INT8 rollouts) and corrects the gap with importance sampling; so
does posttrain: with a precision other than fp32 the PPO ratio's old policy defaults to the sampler's log-probs
and truncated IS is on (config/schema.py), and `train/sampler_kl_k3` / `train/is/*` show the gap every step.

- int8: weight-only int8 for every Linear (the decode matmuls; per output channel, symmetric), activations
  quantized dynamically per call: torch's own dynamic quantization (fbgemm kernels on x86).
- bf16: the whole model cast to bfloat16.

`refresh_` rewrites the copy from the trainer's weights at each weight sync (loop/weight_sync.py
LowPrecisionCopy): quantized layers are re-quantized in place, so no second fp32 model is ever kept. A LoRA
policy is merged first (base + scaled adapter) and the merged weights are what gets quantized.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import torch

PRECISIONS = ("fp32", "bf16", "int8")


def _plain(model: Any) -> Any:
    """A copy of the policy without adapters: LoRA merged into the base weights."""
    m = copy.deepcopy(model)
    return m.merge_and_unload() if hasattr(m, "merge_and_unload") else m


def low_precision_copy(model: Any, precision: str) -> Any:
    """A new model for the sampler in `precision` (the trainer's model is untouched)."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown sampling.precision {precision!r} (known: {', '.join(PRECISIONS)})")
    m = _plain(model).eval().requires_grad_(False)
    if precision == "bf16":
        return m.to(torch.bfloat16)
    if precision == "int8":
        if any(p.is_cuda for p in m.parameters()):
            raise ValueError("sampling.precision=int8 uses torch's CPU int8 kernels; on a GPU use bf16")
        with warnings.catch_warnings():  # torch.ao's deprecation notice; the kernels are the fast path on x86
            warnings.simplefilter("ignore")
            return torch.ao.quantization.quantize_dynamic(
                m, {torch.nn.Linear: torch.ao.quantization.per_channel_dynamic_qconfig}, dtype=torch.qint8)
    return m


def quantize_weight(w: torch.Tensor) -> torch.Tensor:
    """Symmetric per-output-channel int8, with the same observer per_channel_dynamic_qconfig uses (so a refresh
    gives exactly what a fresh quantization would)."""
    w = w.detach().float()
    obs = torch.ao.quantization.per_channel_dynamic_qconfig.weight()
    obs(w)
    scale, zero_point = obs.calculate_qparams()
    return torch.quantize_per_channel(w, scale.double(), zero_point.long(), 0, torch.qint8)


@torch.no_grad()
def refresh_(sampler_model: Any, policy: Any, precision: str) -> None:
    """Write the policy's current weights into the sampler's low-precision copy, in place."""
    src = _plain(policy) if hasattr(policy, "merge_and_unload") else policy
    src_params = dict(src.named_parameters())
    src_modules = dict(src.named_modules())
    qlinear = torch.ao.nn.quantized.dynamic.Linear
    for name, mod in sampler_model.named_modules():
        if isinstance(mod, qlinear):
            lin = src_modules[name]
            mod.set_weight_bias(quantize_weight(lin.weight), None if lin.bias is None else lin.bias.detach().float())
    for name, p in sampler_model.named_parameters():  # everything not quantized: norms, embeddings
        p.copy_(src_params[name].to(p.dtype))
