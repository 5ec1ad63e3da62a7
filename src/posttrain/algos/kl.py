"""Per-token estimators of KL(pi || ref) from log-probs of tokens sampled from pi.

Schulman, "Approximating KL Divergence" (http://joschu.net/blog/kl-approx.html), with log_ratio = ref - pi:
    k1 = -log_ratio                      unbiased, high variance, can be negative
    k2 = log_ratio**2 / 2                biased, low variance
    k3 = exp(log_ratio) - 1 - log_ratio  unbiased, low variance, always >= 0 (GRPO's choice)
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from posttrain.algos.registry import Registry

# fn(logp, ref_logp) -> per-token KL estimate
KLEstimator = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
KL_ESTIMATORS: Registry[KLEstimator] = Registry("KL estimator")


@KL_ESTIMATORS.register("k1")
def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    return logp - ref_logp


@KL_ESTIMATORS.register("k2")
def kl_k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    return 0.5 * (ref_logp - logp) ** 2


def k3(log_ratio: torch.Tensor) -> torch.Tensor:
    """k3 = exp(log_ratio) - 1 - log_ratio: the one k3 in the codebase. With log_ratio = log q(x) - log p(x) for
    x ~ p it estimates KL(p || q) without bias and is never negative. Used for KL to the reference, PPO's approx_kl
    and the sampler-vs-trainer mismatch."""
    return torch.exp(log_ratio) - 1 - log_ratio


@KL_ESTIMATORS.register("k3")
def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    return k3(ref_logp - logp)


def kl_reward_penalty(
    logp_BT: torch.Tensor, ref_logp_BT: torch.Tensor, mask_BT: torch.Tensor, beta: float, estimator: str = "k1"
) -> torch.Tensor:
    """KL as a reward penalty (Ziegler et al. 2019, arXiv:1909.08593; InstructGPT; REINFORCE++, arXiv:2501.03262),
    instead of a KL term in the loss:

        penalty_b = beta * sum_t mask_bt * KL_bt          r_b  <-  r_b - penalty_b

    KL_bt is the named per-token estimator (k1, the classic choice, or k2/k3). Rewards carry no gradient, so the
    result is detached.
    """
    kl_BT = KL_ESTIMATORS[estimator](logp_BT.detach(), ref_logp_BT.detach())
    return beta * torch.where(mask_BT.bool(), kl_BT, torch.zeros_like(kl_BT)).sum(-1)
