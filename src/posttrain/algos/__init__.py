"""Pure tensor functions in name registries: advantage estimators, policy losses, KL estimators, and
sampler/trainer importance-sampling corrections."""

from posttrain.algos.advantages import (ADVANTAGES, dr_grpo_advantages, grpo_advantages, reinforce_pp_advantages,
                                        rloo_advantages)
from posttrain.algos.aggregation import AGGREGATIONS, aggregate
from posttrain.algos.kl import KL_ESTIMATORS, kl_reward_penalty
from posttrain.algos.losses import LOSSES, LossConfig, cispo_loss, gspo_loss, ppo_clip_loss, reinforce_loss
from posttrain.algos.off_policy import mask_by_ratio, tis_weights

__all__ = ["ADVANTAGES", "AGGREGATIONS", "KL_ESTIMATORS", "LOSSES", "LossConfig", "aggregate", "cispo_loss",
           "dr_grpo_advantages", "grpo_advantages", "gspo_loss", "kl_reward_penalty", "mask_by_ratio",
           "ppo_clip_loss", "reinforce_loss", "reinforce_pp_advantages", "rloo_advantages", "tis_weights"]
