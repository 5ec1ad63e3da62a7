"""Pure tensor functions in name registries: advantage estimators, policy losses, loss aggregations, KL
estimators, sampler/trainer importance-sampling corrections, per-token credit weights, ES updates."""

from posttrain.algos.advantages import (
    ADVANTAGES,
    dr_grpo_advantages,
    grpo_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
)
from posttrain.algos.aggregation import AGGREGATIONS, aggregate
from posttrain.algos.kl import KL_ESTIMATORS, k3, kl_reward_penalty
from posttrain.algos.losses import LOSSES, LossInputs, LossParams, cispo_loss, gspo_loss, ppo_clip_loss, reinforce_loss
from posttrain.algos.off_policy import IS_CORRECTIONS, mask_by_ratio, tis_weights
from posttrain.algos.token_weights import TOKEN_WEIGHTS

__all__ = [
    "ADVANTAGES",
    "AGGREGATIONS",
    "IS_CORRECTIONS",
    "KL_ESTIMATORS",
    "LOSSES",
    "TOKEN_WEIGHTS",
    "LossInputs",
    "LossParams",
    "aggregate",
    "cispo_loss",
    "dr_grpo_advantages",
    "grpo_advantages",
    "gspo_loss",
    "k3",
    "kl_reward_penalty",
    "mask_by_ratio",
    "ppo_clip_loss",
    "reinforce_loss",
    "reinforce_pp_advantages",
    "rloo_advantages",
    "tis_weights",
]
