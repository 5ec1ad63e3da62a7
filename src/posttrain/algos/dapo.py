"""DAPO's length and sampling pieces (Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at
Scale", arXiv:2503.14476). Clip-higher lives in the ppo_clip loss (epsilon_high) and token-level aggregation in
aggregation.py; this module holds the rest, as pure functions:

- soft overlong punishment (sec. 3.4, eq. 13): a length-dependent reward penalty in the last `buffer` tokens;
- overlong filtering (sec. 3.4): truncated samples get no loss, so a cut-off answer is not punished for being cut;
- dynamic sampling (sec. 3.2, eq. 11): only groups whose rewards differ carry a GRPO signal; the loop keeps
  sampling prompts until the batch holds enough of them (see loop/dynamic_sampling.py for the refill loop).
"""

from __future__ import annotations

import torch


def soft_overlong_penalty(lengths_N: torch.Tensor, max_tokens: int, buffer: int, factor: float = 1.0) -> torch.Tensor:
    """DAPO eq. 13, with L_max = max_tokens and L_cache = buffer:

        R_len(y) = 0                                       |y| <= L_max - L_cache
                 = ((L_max - L_cache) - |y|) / L_cache     L_max - L_cache < |y| <= L_max
                 = -1                                      L_max < |y|

    scaled by `factor`; the result is added to the task reward. buffer = 0 turns it off (all zeros).
    """
    lengths = lengths_N.float()
    if buffer <= 0:
        return torch.zeros_like(lengths)
    if buffer > max_tokens:
        raise ValueError(f"overlong buffer ({buffer}) must not exceed max_tokens ({max_tokens})")
    start = max_tokens - buffer
    pen = torch.clamp((start - lengths) / buffer, min=-1.0, max=0.0)
    return factor * pen


def overlong_keep_mask(finish_reasons_N: list[str]) -> list[bool]:
    """Overlong filtering: False for samples the token limit cut off (finish_reason 'length')."""
    return [r != "length" for r in finish_reasons_N]


def has_signal(rewards_G: list[float], tol: float = 1e-9) -> bool:
    """DAPO's dynamic-sampling condition 0 < |{correct}| < G, generalised to real rewards: the group's rewards
    are not all equal. A group without signal has all-zero advantages under every group baseline."""
    return max(rewards_G) - min(rewards_G) > tol
