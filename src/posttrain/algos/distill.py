"""On-policy distillation: a per-token reverse-KL term toward a teacher, on the student's own samples.

The student samples y ~ pi; the teacher q scores the same tokens. Reverse KL(pi || q) on the student's own
tokens is estimated per token by log pi(y_t) - log q(y_t), and its gradient by the score function: each
sampled token is pushed up by how much more the teacher likes it than the student does,

    d_t    = log q(y_t) - log pi_old(y_t)            detached: a per-token advantage (discount 0)
    loss_t = -coef * d_t * ratio_t                   ratio_t = pi(y_t) / pi_old(y_t), 1 with grad on-policy

which is the recipe of Agarwal et al. 2024 (GKD, arXiv:2306.13649) as run by tinker-cookbook and prime-rl
(reverse KL as a per-token reward, one importance-weighted policy-gradient step). The term is aggregated with
the batch's own normalizers, so it adds to the RL loss under gradient accumulation exactly.
"""

from __future__ import annotations

import torch

from posttrain.algos.aggregation import aggregate


def masked_mean(x_BT: torch.Tensor, mask_BT: torch.Tensor) -> float:
    m = mask_BT.to(x_BT.dtype)
    return float((x_BT * m).sum() / m.sum().clamp(min=1))


def reverse_kl_loss(
    logp_BT: torch.Tensor,
    behaviour_BT: torch.Tensor,
    teacher_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    coef: float,
    aggregation: str,
    total_tokens: float | None = None,
    total_seqs: float | None = None,
    max_tokens: int | None = None,
    token_weights_BT: torch.Tensor | None = None,
    metric_mask_BT: torch.Tensor | None = None,
    seq_tokens_B: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The distillation loss of one micro-batch and its metrics (`teacher/kl`: the k1 estimate of
    KL(student || teacher) per token on the student's samples; `teacher/logp`: the teacher's mean log-prob),
    averaged over `metric_mask_BT` (default: the loss mask; a teacher with no opinion on some tokens passes the
    tokens it scored)."""
    if teacher_BT.shape != logp_BT.shape:
        raise ValueError(
            f"teacher log-probs of shape {tuple(teacher_BT.shape)} do not fit the student's {tuple(logp_BT.shape)}"
        )
    d_BT = (teacher_BT - behaviour_BT).detach()
    ratio_BT = torch.exp(logp_BT - behaviour_BT.detach())
    per_token = -d_BT * ratio_BT
    if token_weights_BT is not None:  # the sampler-mismatch correction weighs this term like the RL term
        per_token = (
            per_token * torch.as_tensor(token_weights_BT, dtype=per_token.dtype, device=per_token.device).detach()
        )
    loss = coef * aggregate(per_token, mask_BT, aggregation, total_tokens, total_seqs, max_tokens, seq_tokens_B)
    mm_BT = mask_BT if metric_mask_BT is None else metric_mask_BT
    return loss, {"teacher/kl": masked_mean(-d_BT, mm_BT), "teacher/logp": masked_mean(teacher_BT, mm_BT)}
