"""Advantage estimators: rewards of a batch of samples -> one advantage per sample.

Signature: `fn(rewards_N, group_ids_N, scale_std=True, eps=1e-6) -> adv_N`, pure tensor math.
"""

from __future__ import annotations

from typing import Protocol

import torch

from posttrain.algos.registry import Registry


class AdvantageFn(Protocol):
    def __call__(
        self, rewards_N: torch.Tensor, group_ids_N: torch.Tensor, scale_std: bool = True, eps: float = 1e-6
    ) -> torch.Tensor: ...


ADVANTAGES: Registry[AdvantageFn] = Registry("advantage estimator")


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
def grpo_advantages(
    rewards_N: torch.Tensor, group_ids_N: torch.Tensor, scale_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
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


@ADVANTAGES.register("dr_grpo")
def dr_grpo_advantages(
    rewards_N: torch.Tensor, group_ids_N: torch.Tensor, scale_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training", arXiv:2503.20783, sec. 3.2):

        A_i = r_i - mean(r_group)

    Never divided by the group std, whatever `scale_std` says: the std term up-weights questions that are
    almost always (or almost never) solved, a difficulty bias. Pair with the `seq-mean-token-sum-norm`
    aggregation to also remove GRPO's length bias.
    """
    return grpo_advantages(rewards_N, group_ids_N, scale_std=False, eps=eps)


@ADVANTAGES.register("rloo")
def rloo_advantages(
    rewards_N: torch.Tensor, group_ids_N: torch.Tensor, scale_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """RLOO, REINFORCE Leave-One-Out (Kool et al. 2019, "Buy 4 REINFORCE Samples, Get a Baseline for Free!";
    Ahmadian et al. 2024, arXiv:2402.14740): the baseline of a sample is the mean of the *other* samples:

        A_i = r_i - 1/(n-1) * sum_{j != i, same group} r_j  =  n/(n-1) * (r_i - mean(r_group))

    A group of size 1 has no other samples: its advantage is 0. Unscaled by definition: `scale_std` is ignored.
    """
    r_N = rewards_N.float()
    _, inv = torch.unique(group_ids_N, return_inverse=True)
    n_groups = int(inv.max()) + 1 if inv.numel() else 0
    count_N = torch.zeros(n_groups).index_add_(0, inv, torch.ones_like(r_N))[inv]
    sum_N = torch.zeros(n_groups).index_add_(0, inv, r_N)[inv]
    baseline_N = (sum_N - r_N) / (count_N - 1).clamp(min=1)
    return torch.where(count_N > 1, r_N - baseline_N, torch.zeros_like(r_N))


@ADVANTAGES.register("reinforce_pp")
def reinforce_pp_advantages(
    rewards_N: torch.Tensor,
    group_ids_N: torch.Tensor,
    scale_std: bool = True,
    eps: float = 1e-6,
    group_baseline: bool = False,
) -> torch.Tensor:
    """REINFORCE++ (Hu et al. 2025, arXiv:2501.03262): global advantage normalisation over the whole batch

        A_i = (r_i - mean_batch(r)) / (std_batch(r) + eps)

    group_baseline=True ("REINFORCE++-baseline"): first subtract the group mean, then normalise over the batch
        a_i = r_i - mean(r_group);   A_i = (a_i - mean_batch(a)) / (std_batch(a) + eps)     (mean_batch(a) = 0)

    std is unbiased (like torch.std); a batch of one sample gets 0. scale_std=False keeps only the centring.
    Sequence-level rewards only: the paper's per-token KL-in-reward is `kl.kl_reward_penalty`, applied by the caller.
    """
    a_N = rewards_N.float()
    if group_baseline:
        a_N = a_N - group_mean_std(a_N, group_ids_N)[0]
    a_N = a_N - a_N.mean()
    if scale_std:
        std = a_N.std() if a_N.numel() > 1 else a_N.new_zeros(())
        a_N = a_N / (std + eps)
    return a_N


@ADVANTAGES.register("reward")
def reward_as_advantage(
    rewards_N: torch.Tensor, group_ids_N: torch.Tensor, scale_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """REINFORCE without a baseline (Williams 1992): A_i = r_i. Groups and `scale_std` play no part.

    What supervised steps are in this form: the warm start gives each demonstration reward 1, so its loss is the
    demonstration's negative log-likelihood; the preflight's probe step gives +-1 so every sequence is trained on.
    High variance as an RL estimator: prefer a group baseline (grpo, rloo) for rollouts.
    """
    return rewards_N.float().clone()
