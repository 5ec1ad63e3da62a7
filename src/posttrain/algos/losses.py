"""Policy losses: `fn(logp, old_logp, ref_logp, adv, mask, cfg) -> (loss, metrics)`.

Shapes: logp_BT, old_logp_BT, ref_logp_BT (or None), mask_BT over completion tokens; adv_B per sequence.
`cfg` carries the hyper-parameters and the batch-wide normalizers (see aggregation.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from posttrain.algos.aggregation import aggregate
from posttrain.algos.kl import KL_ESTIMATORS
from posttrain.algos.registry import Registry

LOSSES: Registry = Registry("policy loss")


@dataclass
class LossConfig:
    epsilon: float = 0.2
    epsilon_high: float | None = None  # None: same as epsilon
    beta: float = 0.0
    kl_estimator: str = "k3"
    aggregation: str = "token-mean"
    total_tokens: float | None = None  # loss tokens in the whole optimizer batch
    total_seqs: float | None = None  # sequences in the whole optimizer batch
    max_tokens: int | None = None  # completion budget, for seq-mean-token-sum-norm


def _masked_mean(x_BT: torch.Tensor, mask_BT: torch.Tensor) -> float:
    m = mask_BT.to(x_BT.dtype)
    return float((x_BT * m).sum() / m.sum().clamp(min=1))


@LOSSES.register("ppo_clip")
def ppo_clip_loss(logp_BT: torch.Tensor, old_logp_BT: torch.Tensor, ref_logp_BT: torch.Tensor | None,
                  adv_B: torch.Tensor, mask_BT: torch.Tensor, cfg: LossConfig) -> tuple[torch.Tensor, dict[str, float]]:
    """Token-level clipped surrogate (PPO, Schulman et al. 2017, arXiv:1707.06347; as used by GRPO), with
    DAPO's decoupled clip range (clip-higher, arXiv:2503.14476) and an optional KL-to-reference term:

        ratio  = exp(logp - old_logp)
        loss_t = max(-A * ratio, -A * clip(ratio, 1 - eps_low, 1 + eps_high)) + beta * KL_t
    """
    eps_low = cfg.epsilon
    eps_high = cfg.epsilon_high if cfg.epsilon_high is not None else cfg.epsilon
    adv_BT = adv_B[:, None].to(logp_BT.dtype)
    log_ratio = logp_BT - old_logp_BT
    ratio = torch.exp(log_ratio)
    pg_loss1 = -adv_BT * ratio
    pg_loss2 = -adv_BT * torch.clamp(ratio, 1 - eps_low, 1 + eps_high)
    per_token = torch.max(pg_loss1, pg_loss2)
    metrics: dict[str, float] = {}
    if cfg.beta > 0:
        if ref_logp_BT is None:
            raise ValueError("beta > 0 needs reference log-probs")
        kl_BT = KL_ESTIMATORS[cfg.kl_estimator](logp_BT, ref_logp_BT)
        per_token = per_token + cfg.beta * kl_BT
        metrics["kl_ref"] = _masked_mean(kl_BT.detach(), mask_BT)
    loss = aggregate(per_token, mask_BT, cfg.aggregation, cfg.total_tokens, cfg.total_seqs, cfg.max_tokens)
    with torch.no_grad():
        clipped_low = (ratio < 1 - eps_low) & (adv_BT < 0)
        clipped_high = (ratio > 1 + eps_high) & (adv_BT > 0)
        metrics.update({
            "clipfrac_low": _masked_mean(clipped_low.float(), mask_BT),
            "clipfrac_high": _masked_mean(clipped_high.float(), mask_BT),
            "ratio_mean": _masked_mean(ratio, mask_BT),
            # approx KL(old || new), k3 form: http://joschu.net/blog/kl-approx.html
            "approx_kl": _masked_mean((ratio - 1) - log_ratio, mask_BT),
        })
    return loss, metrics
