"""Reward functions and the weighted Rubric."""

from posttrain.rewards.rubric import RewardComponent, RewardFunc, Rubric, Score
from posttrain.rewards.text import completion_text

__all__ = ["RewardComponent", "RewardFunc", "Rubric", "Score", "completion_text"]
