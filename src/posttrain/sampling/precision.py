"""The sampler's own low-precision copy of the policy (`sampling.precision`): fp32, bf16 or int8.

Decoding streams every weight once per generated token, so on a CPU it is bound by memory bandwidth. The field
samples in lower precision than it trains (bf16 or FP8 vLLM samplers beside fp32 trainers; FlashRL's INT8
rollouts) and corrects the gap with importance sampling; so does posttrain: with a precision other than fp32 the
PPO ratio's old policy defaults to the sampler's log-probs and truncated IS is on (config/schema.py), and
`train/sampler_kl_k3` / `train/is/*` show the gap every step.

- bf16: the whole model cast to bfloat16.
- int8: weight-only int8 for every Linear (symmetric, per output channel), activations in bf16, through
  torch's `_weight_int8pack_mm` kernel: a quarter of fp32's weight bytes.

Measured (`python bench/sampler_precision.py`: the default model, batch 16, 64 new tokens, 2 threads; closeness
teacher-forced on json-extract prompts and answers; decode speed relative to the fp32 sampler through MKL, on
three 2-core AMD EPYCs; bench/results/sampler_precision*.md):

| sampler | AVX-512 + BF16 | AVX2 (Zen 3) | AVX2, earlier | KL(fp32 || copy) per token | same argmax |
|---|---:|---:|---:|---:|---:|
| fp32 oneDNN-packed copy | 2.07x | 1.31x | | 0 | 100% |
| bf16 (packed where oneDNN can) | 2.75x | 0.53x | 1.42x | 0.0005 | 99.7% |
| int8 (weight-only) | 1.93x | 1.16x | 1.07x | 0.003 | 97.5% |
| torch dynamic int8 (weights and activations), not used | 2.72x | 2.17x | 1.86x | 0.92-0.94 | 68-70% |

So the fast choice depends on the CPU: bf16 where it has bf16 arithmetic, a packed fp32 copy where it does not
(`precision_advice` says so at build). Torch's dynamic quantization (int8 activations per tensor, fbgemm) was the
first int8 here: it is the fastest but wrecks the default model (a json-extract run with it never wrote valid
JSON; `down_proj` alone costs KL 0.67); `tests/sampling/test_precision.py` bounds the KL of every copy on the
real default model so no such path ships again.

`refresh_` rewrites the copy from the trainer's weights at each weight sync (loop/weight_sync.py
LowPrecisionCopy), in place, so no second fp32 model is ever kept. A LoRA policy is merged first (base + scaled
adapter) and the merged weights are what gets quantized.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from posttrain.sampling.packed_linear import PackedLinear, can_pack, pack_linears_

PRECISIONS = ("fp32", "bf16", "int8")
_DTYPES = {"fp32": None, "bf16": torch.bfloat16}  # fp32: the policy's own dtype, whatever it is


class Int8Linear(torch.nn.Module):
    """y = x W^T + b with W stored as int8 per output channel (scale = max |row| / 127) and x taken in bf16."""

    # buffers (register_buffer)
    weight_int8: torch.Tensor
    scale: torch.Tensor
    bias: torch.Tensor | None

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("weight_int8", torch.empty(linear.out_features, linear.in_features, dtype=torch.int8))
        self.register_buffer("scale", torch.empty(linear.out_features, dtype=torch.bfloat16))
        self.register_buffer("bias", None if linear.bias is None else torch.empty(linear.out_features))
        self.load_(linear.weight, linear.bias)

    @torch.no_grad()
    def load_(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        """Quantize `weight` into this layer, in place."""
        w = weight.detach().float()
        scale = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-12)
        self.weight_int8.copy_(torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8))
        self.scale.copy_(scale.to(torch.bfloat16))
        if self.bias is not None and bias is not None:
            self.bias.copy_(bias.detach().float())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        y = torch.ops.aten._weight_int8pack_mm(
            x.reshape(-1, shape[-1]).to(torch.bfloat16), self.weight_int8, self.scale
        )
        y = y.reshape(*shape[:-1], self.out_features).to(x.dtype)
        return y if self.bias is None else y + self.bias.to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 weights, bf16 activations"


def _plain(model: Any) -> Any:
    """A copy of the policy without adapters: LoRA merged into the base weights."""
    m = copy.deepcopy(model)
    return m.merge_and_unload() if hasattr(m, "merge_and_unload") else m


def _linears(model: Any) -> list[tuple[Any, str, torch.nn.Linear]]:
    return [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if isinstance(child, torch.nn.Linear)
    ]


def low_precision_copy(model: Any, precision: str, packed: bool = False) -> Any:
    """A new model for the sampler in `precision` (the trainer's model is untouched).

    `packed`: fp32 and bf16 copies hold their Linear weights packed by oneDNN (packed_linear.py), where this CPU
    can pack that dtype; otherwise they stay plain Linears. int8 has its own kernel and ignores it."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown sampling.precision {precision!r} (known: {', '.join(PRECISIONS)})")
    m = _plain(model).eval().requires_grad_(False)
    if precision in _DTYPES:
        dtype = copy_dtype(m, precision)
        m = m.to(dtype)
        if packed:
            pack_linears_(m, dtype)
        return m
    if precision == "int8":
        if any(p.is_cuda for p in m.parameters()):
            raise ValueError("sampling.precision=int8 is the CPU weight-only int8 path; on a GPU use bf16")
        for parent, name, lin in _linears(m):
            setattr(parent, name, Int8Linear(lin))  # the fp32 weight goes with the Linear (tied embeddings stay)
    return m


def copy_dtype(model: Any, precision: str) -> torch.dtype:
    """The dtype of a copy in `precision`: bf16, or for "fp32" the policy's own dtype (a copy of its weights as
    they are)."""
    return _DTYPES[precision] or next(model.parameters()).dtype


def precision_advice(precision: str, device_type: str) -> str | None:
    """A note for the user when `sampling.precision` will be slow on this machine, else None.

    bf16 on a CPU without native bf16 arithmetic (oneDNN cannot pack bf16 there: no AVX-512 bw/vl/dq or
    AVX-NE-CONVERT) decoded at 0.53x the fp32 MKL sampler's speed on an AVX2 EPYC (bench/results/
    sampler_precision_avx2.md), where a packed fp32 copy was the fastest usable sampler (1.31x)."""
    if precision == "bf16" and device_type == "cpu" and not can_pack(torch.bfloat16):
        return (
            "sampling.precision=bf16: this CPU has no native bf16 arithmetic, so a bf16 sampler decodes "
            "slower than fp32 (0.53x on an AVX2 EPYC, bench/results/sampler_precision_avx2.md); "
            "sampling.precision=fp32 sampling.packed_weights=on is the fast choice here"
        )
    return None


def should_pack(model: Any, precision: str, setting: str, holds_copy: bool) -> bool:
    """Whether the sampler's weights for `model` in `precision` are a oneDNN-packed copy, per
    `sampling.packed_weights` (`setting`); `holds_copy`: the sampler has a copy of its own anyway (a low-precision
    one, or the async loop's). Raises when "on" asks for what this CPU cannot pack.

    auto packs only a copy the sampler holds anyway, and not an fp32 copy of a LoRA policy: unpacked it stays a
    peft model whose sync copies only the adapters; packed, every sync would merge a whole copy of the policy. on
    packs whatever it can. int8 has its own kernel and GPU copies are never packed."""
    on_cpu = next(model.parameters()).device.type == "cpu"
    if setting == "off" or (setting == "auto" and not holds_copy) or precision not in _DTYPES or not on_cpu:
        return False
    if not can_pack(copy_dtype(model, precision)):
        if setting == "on":
            raise ValueError(
                f"sampling.packed_weights=on: oneDNN cannot pack {precision} weights on this CPU; use auto or off"
            )
        return False
    return setting == "on" or not (precision == "fp32" and hasattr(model, "merge_and_unload"))


@torch.no_grad()
def refresh_(sampler_model: Any, policy: Any, precision: str) -> None:
    """Write the policy's current weights into the sampler's low-precision copy, in place."""
    src = _plain(policy) if hasattr(policy, "merge_and_unload") else policy
    src_params = dict(src.named_parameters())
    src_modules = dict(src.named_modules())
    for name, mod in sampler_model.named_modules():
        if isinstance(mod, (Int8Linear, PackedLinear)):
            lin = src_modules[name]
            mod.load_(lin.weight, lin.bias)
    for name, p in sampler_model.named_parameters():  # everything not quantized: norms, embeddings
        p.copy_(src_params[name].to(p.dtype))


@torch.no_grad()
def closeness(reference: Any, candidate: Any, tokenizer: Any, pairs: list[tuple[Any, str]]) -> tuple[float, float]:
    """How close `candidate`'s next-token distributions are to `reference`'s, teacher-forced on (prompt, answer)
    pairs (a prompt as `render_prompt` takes it, the answer as text): KL(reference || candidate) in nats per
    answer token, and the share of answer tokens whose argmax the two agree on."""
    import torch.nn.functional as F

    from posttrain.models import render_prompt

    kl, agree, n = 0.0, 0, 0
    for prompt, answer in pairs:
        p_ids = render_prompt(tokenizer, prompt)
        ids = torch.tensor([p_ids + tokenizer.encode(answer, add_special_tokens=False)])
        a = F.log_softmax(reference(ids).logits[0, len(p_ids) - 1 : -1].float(), -1)
        b = F.log_softmax(candidate(ids).logits[0, len(p_ids) - 1 : -1].float(), -1)
        kl += float((a.exp() * (a - b)).sum())
        agree += int((a.argmax(-1) == b.argmax(-1)).sum())
        n += a.shape[0]
    return kl / max(n, 1), agree / max(n, 1)
