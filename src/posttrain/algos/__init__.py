"""Pure tensor functions in name registries: advantage estimators, policy losses, KL estimators."""

from posttrain.algos.advantages import ADVANTAGES, grpo_advantages
from posttrain.algos.aggregation import AGGREGATIONS, aggregate
from posttrain.algos.kl import KL_ESTIMATORS
from posttrain.algos.losses import LOSSES, LossConfig, ppo_clip_loss

__all__ = ["ADVANTAGES", "AGGREGATIONS", "KL_ESTIMATORS", "LOSSES", "LossConfig", "aggregate", "grpo_advantages",
           "ppo_clip_loss"]
