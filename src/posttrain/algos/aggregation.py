"""How per-token losses become one scalar.

All modes take normalizers for the *whole* optimizer batch, so that summing micro-batch losses under
gradient accumulation gives exactly the full-batch loss:
    token-mean               sum_{b,t} l_bt m_bt / total_tokens                       (DAPO: long answers count more)
    seq-mean-token-mean      sum_b (sum_t l_bt m_bt / |o_b|) / total_seqs              (original GRPO)
    seq-mean-token-sum-norm  sum_b (sum_t l_bt m_bt / max_tokens) / total_seqs         (Dr. GRPO: no length bias)
"""

from __future__ import annotations

import torch

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def aggregate(loss_BT: torch.Tensor, mask_BT: torch.Tensor, mode: str, total_tokens: float | None = None,
              total_seqs: float | None = None, max_tokens: int | None = None) -> torch.Tensor:
    mask_BT = mask_BT.to(loss_BT.dtype)
    masked = loss_BT * mask_BT
    if mode == "token-mean":
        denom = total_tokens if total_tokens is not None else mask_BT.sum().clamp(min=1)
        return masked.sum() / denom
    seqs = total_seqs if total_seqs is not None else loss_BT.shape[0]
    if mode == "seq-mean-token-mean":
        return (masked.sum(-1) / mask_BT.sum(-1).clamp(min=1)).sum() / seqs
    if mode == "seq-mean-token-sum-norm":
        norm = max_tokens if max_tokens is not None else loss_BT.shape[1]
        return (masked.sum(-1) / norm).sum() / seqs
    raise KeyError(f"unknown aggregation {mode!r} (known: {', '.join(AGGREGATIONS)})")
