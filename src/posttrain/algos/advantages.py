"""Advantage estimators: rewards of a batch of samples -> one advantage per sample.

Signature: `fn(rewards_N, group_ids_N, scale_std=True, eps=1e-6) -> adv_N`, pure tensor math.
"""

from __future__ import annotations

import torch

from posttrain.algos.registry import Registry

ADVANTAGES: Registry = Registry("advantage estimator")


def group_mean_std(values_N: torch.Tensor, group_ids_N: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample mean and (unbiased, like torch.std) std of the sample's group."""
    _, inv = torch.unique(group_ids_N, return_inverse=True)
    n_groups = int(inv.max()) + 1 if inv.numel() else 0
    count_G = torch.zeros(n_groups).index_add_(0, inv, torch.ones_like(values_N))
    mean_G = torch.zeros(n_groups).index_add_(0, inv, values_N) / count_G
    sq_G = torch.zeros(n_groups).index_add_(0, inv, (values_N - mean_G[inv]) ** 2)
    std_G = torch.sqrt(sq_G / (count_G - 1).clamp(min=1))
    return mean_G[inv], std_G[inv]


@ADVANTAGES.register("grpo")
def grpo_advantages(rewards_N: torch.Tensor, group_ids_N: torch.Tensor, scale_std: bool = True,
                    eps: float = 1e-6) -> torch.Tensor:
    """GRPO (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300, eq. 3):

        A_i = (r_i - mean(r_group)) / (std(r_group) + eps)      (std scaling on)
        A_i =  r_i - mean(r_group)                              (std scaling off, as Dr. GRPO recommends)

    A group whose rewards are all equal gets advantage 0 for every sample: it carries no learning signal.
    """
    mean_N, std_N = group_mean_std(rewards_N.float(), group_ids_N)
    adv_N = rewards_N.float() - mean_N
    if scale_std:
        adv_N = adv_N / (std_N + eps)
    return adv_N
