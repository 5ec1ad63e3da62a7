"""Reward shaping applied when a group is scored, before any group filter sees the rewards.

The DAPO soft overlong penalty lives here: dynamic sampling keeps or drops a group by its shaped rewards, so
the penalty must be in them first. Shaping that needs a model pass (KL to the reference as a reward) happens in
batch assembly (loop/batch.py). The math is in algos/dapo.py.
"""

from __future__ import annotations

import torch

from posttrain.algos.dapo import soft_overlong_penalty
from posttrain.types import Group


def apply_overlong_penalty(groups: list[Group], buffer_frac: float, penalty: float, max_tokens: int) -> float:
    """DAPO soft overlong punishment over the last `buffer_frac` of `max_tokens`, added to each trajectory's reward
    (and recorded as the `overlong_penalty` component). Returns the mean penalty; 0 when off."""
    buffer = round(buffer_frac * max_tokens)
    if buffer <= 0:
        return 0.0
    trajs = [t for g in groups for t in g.trajectories_G]
    lengths = torch.tensor([t.num_completion_tokens for t in trajs])
    pen = soft_overlong_penalty(lengths, max_tokens, buffer, penalty)
    for t, p in zip(trajs, pen.tolist(), strict=True):
        if p != 0.0:
            t.reward += p
            t.reward_components["overlong_penalty"] = p
    return float(pen.mean()) if len(trajs) else 0.0
