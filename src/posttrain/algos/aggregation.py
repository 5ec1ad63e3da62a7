"""How per-token losses become one scalar: `fn(loss_BT, mask_BT, total_tokens, total_seqs, max_tokens)`.

All modes take normalizers for the *whole* optimizer batch, so that summing micro-batch losses under
gradient accumulation gives exactly the full-batch loss:
    token-mean               sum_{b,t} l_bt m_bt / total_tokens                       (DAPO: long answers count more)
    seq-mean-token-mean      sum_b (sum_t l_bt m_bt / |o_b|) / total_seqs              (original GRPO)
    seq-mean-token-sum-norm  sum_b (sum_t l_bt m_bt / max_tokens) / total_seqs         (Dr. GRPO: no length bias)
A normalizer left None falls back to this call's own count (one micro-batch = the whole batch).
"""

from __future__ import annotations

import torch

from posttrain.algos.registry import Registry

AGGREGATIONS: Registry = Registry("loss aggregation")


@AGGREGATIONS.register("token-mean")
def token_mean(loss_BT, mask_BT, total_tokens=None, total_seqs=None, max_tokens=None) -> torch.Tensor:
    denom = total_tokens if total_tokens is not None else mask_BT.sum().clamp(min=1)
    return (loss_BT * mask_BT).sum() / denom


@AGGREGATIONS.register("seq-mean-token-mean")
def seq_mean_token_mean(loss_BT, mask_BT, total_tokens=None, total_seqs=None, max_tokens=None) -> torch.Tensor:
    seqs = total_seqs if total_seqs is not None else loss_BT.shape[0]
    return ((loss_BT * mask_BT).sum(-1) / mask_BT.sum(-1).clamp(min=1)).sum() / seqs


@AGGREGATIONS.register("seq-mean-token-sum-norm")
def seq_mean_token_sum_norm(loss_BT, mask_BT, total_tokens=None, total_seqs=None, max_tokens=None) -> torch.Tensor:
    seqs = total_seqs if total_seqs is not None else loss_BT.shape[0]
    norm = max_tokens if max_tokens is not None else loss_BT.shape[1]
    return ((loss_BT * mask_BT).sum(-1) / norm).sum() / seqs


def aggregate(
    loss_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    mode: str,
    total_tokens: float | None = None,
    total_seqs: float | None = None,
    max_tokens: int | None = None,
) -> torch.Tensor:
    return AGGREGATIONS[mode](loss_BT, mask_BT.to(loss_BT.dtype), total_tokens, total_seqs, max_tokens)
