"""oneDNN-prepacked Linear layers for the sampler's own copy of the policy (CPU decode).

A decode step multiplies a handful of rows (the batch) by every weight matrix, and both MKL and oneDNN re-pack
the weight into their blocked layout on every call; at decode batch sizes that repacking is a large share of the
work (an earlier perf profile of the fp32 sampler put MKL's pack copies at about a quarter of its samples).
oneDNN can pack a weight once (`torch.ops.mkldnn._reorder_linear_weight`, what inductor's CPU freezing uses) and
reuse it for any number of rows, so a sampler that owns its weights (a low-precision copy, or an fp32 copy of
its own) packs them at each weight sync and decodes with `torch.ops.mkldnn._linear_pointwise`.

Measured with `python bench/sampler_precision.py` (the table in docs/results/speed.md, with the CPU it ran on).
Whether a dtype can be packed depends on the CPU: bf16 needs AVX-512 (bw, vl, dq) or AVX-NE-CONVERT, fp32 packs on
any x86 with AVX2. `can_pack` asks oneDNN itself rather than reading CPU flags, and a layer that cannot be packed
stays a plain Linear.

The packed weight is an opaque oneDNN tensor: no autograd, not in `state_dict`, rebuilt from the trainer's
weights by `load_` (sampling/precision.py refresh_ calls it at every sync). It is for inference only.
"""

from __future__ import annotations

import functools

import torch


@functools.cache
def can_pack(dtype: torch.dtype) -> bool:
    """Whether oneDNN on this CPU packs and multiplies `dtype` weights (tried once on a tiny layer)."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        w = torch.zeros(8, 8, dtype=dtype)
        y = torch.ops.mkldnn._linear_pointwise(
            torch.ones(2, 8, dtype=dtype), torch.ops.mkldnn._reorder_linear_weight(w, 2), None, "none", [], ""
        )
        return y.shape == (2, 8)
    except (RuntimeError, AttributeError, NotImplementedError):
        return False


class PackedLinear(torch.nn.Module):
    """y = x W^T + b with W held packed by oneDNN in `dtype`; inputs are cast to `dtype`, outputs come back in
    the input's dtype."""

    bias: torch.Tensor | None  # a buffer (register_buffer)

    def __init__(self, linear: torch.nn.Linear, dtype: torch.dtype, rows_hint: int = 16):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.dtype, self.rows_hint = dtype, rows_hint  # rows_hint: the batch oneDNN picks its blocking for
        self.packed: torch.Tensor | None = None  # not a buffer: an opaque oneDNN tensor has no storage to save
        self.register_buffer("bias", None if linear.bias is None else torch.empty(linear.out_features, dtype=dtype))
        self.load_(linear.weight, linear.bias)

    @torch.no_grad()
    def load_(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        """Pack `weight` (any dtype) into this layer, replacing the previous packing."""
        if tuple(weight.shape) != (self.out_features, self.in_features):
            raise ValueError(
                f"weight of shape {tuple(weight.shape)} for a packed layer of {(self.out_features, self.in_features)}"
            )
        w = weight.detach().to(self.dtype).contiguous()
        self.packed = torch.ops.mkldnn._reorder_linear_weight(w, self.rows_hint)
        if self.bias is not None and bias is not None:
            self.bias.copy_(bias.detach())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.mkldnn._linear_pointwise(x.to(self.dtype), self.packed, self.bias, "none", [], "")
        return y.to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, oneDNN-packed {self.dtype}"


def pack_linears_(model: torch.nn.Module, dtype: torch.dtype) -> int:
    """Replace every CPU nn.Linear in `model` by a PackedLinear in `dtype`, in place; returns how many.

    Nothing is replaced when oneDNN cannot pack `dtype` on this CPU or the model is not on the CPU. A model with
    LoRA adapters is refused: its base layers would lose the weights the adapters merge into (merge first)."""
    if hasattr(model, "merge_and_unload"):
        raise ValueError("pack_linears_ needs a plain model: merge the LoRA adapters first (merge_and_unload)")
    if not can_pack(dtype) or any(p.device.type != "cpu" for p in model.parameters()):
        return 0
    from posttrain.models.matmul import ROUTABLE

    found = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if isinstance(child, torch.nn.Linear) and type(child) in ROUTABLE  # ROUTABLE: Linear classes
    ]  # exact: a LoRA or quantized layer keeps its forward
    for parent, name, lin in found:
        setattr(parent, name, PackedLinear(lin, dtype))
    return len(found)
