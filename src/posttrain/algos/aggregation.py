"""How per-token losses become one scalar: `fn(loss_BT, mask_BT, total_tokens, total_seqs, max_tokens, seq_tokens_B)`.

All modes take normalizers for the *whole* optimizer batch, so that summing micro-batch losses under
gradient accumulation gives exactly the full-batch loss:
    token-mean               sum_{b,t} l_bt m_bt / total_tokens                       (DAPO: long answers count more)
    seq-mean-token-mean      sum_b (sum_t l_bt m_bt / |o_b|) / total_seqs              (original GRPO)
    seq-mean-token-sum-norm  sum_b (sum_t l_bt m_bt / max_tokens) / total_seqs         (Dr. GRPO: no length bias)
A normalizer left None falls back to this call's own count (one micro-batch = the whole batch).

An episode cut into several sequences (an agent whose calls did not extend one another: its pieces,
Sequence.episode) must weigh what it would as one sequence. token-mean and seq-mean-token-sum-norm are sums over
tokens, already split-invariant once `total_seqs` counts episodes (loop/batch.py). seq-mean-token-mean divides
by the sequence's length: a piece divides by its episode's loss tokens instead (`seq_tokens_B`: > 0 for a piece,
0 for a whole sequence), which weighs each piece by its share of the episode's tokens (1/k of the episode for k
equal pieces) and gives every token exactly the weight it has in the unsplit episode.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from posttrain.algos.registry import Registry

# fn(loss_BT, mask_BT, total_tokens, total_seqs, max_tokens, seq_tokens_B) -> the scalar loss
Aggregation = Callable[
    [torch.Tensor, torch.Tensor, "float | None", "float | None", "int | None", "torch.Tensor | None"], torch.Tensor
]
AGGREGATIONS: Registry[Aggregation] = Registry("loss aggregation")


@AGGREGATIONS.register("token-mean")
def token_mean(
    loss_BT, mask_BT, total_tokens=None, total_seqs=None, max_tokens=None, seq_tokens_B=None
) -> torch.Tensor:
    denom = total_tokens if total_tokens is not None else mask_BT.sum().clamp(min=1)
    return (loss_BT * mask_BT).sum() / denom


@AGGREGATIONS.register("seq-mean-token-mean")
def seq_mean_token_mean(
    loss_BT, mask_BT, total_tokens=None, total_seqs=None, max_tokens=None, seq_tokens_B=None
) -> torch.Tensor:
    seqs = total_seqs if total_seqs is not None else loss_BT.shape[0]
    length_B = mask_BT.sum(-1)
    if seq_tokens_B is not None:  # a piece: its episode's tokens
        given_B = torch.as_tensor(seq_tokens_B, dtype=length_B.dtype, device=length_B.device)
        length_B = torch.where(given_B > 0, given_B, length_B)
    return ((loss_BT * mask_BT).sum(-1) / length_B.clamp(min=1)).sum() / seqs


@AGGREGATIONS.register("seq-mean-token-sum-norm")
def seq_mean_token_sum_norm(
    loss_BT, mask_BT, total_tokens=None, total_seqs=None, max_tokens=None, seq_tokens_B=None
) -> torch.Tensor:
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
    seq_tokens_B: torch.Tensor | None = None,
) -> torch.Tensor:
    """`seq_tokens_B`: per row, the loss tokens of the episode it is a piece of (0: a whole sequence; None: no
    pieces here), for the per-sequence means."""
    return AGGREGATIONS[mode](loss_BT, mask_BT.to(loss_BT.dtype), total_tokens, total_seqs, max_tokens, seq_tokens_B)
