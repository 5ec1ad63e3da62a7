"""Per-token credit weights: `fn(entropy_BT, mask_BT, **options) -> weights_BT`, detached, 0 on padding.

The losses multiply these into their policy-gradient term (LossInputs.token_weights_BT), so credit can be moved
between tokens without touching any loss. DACA-GRPO (the seed post) derives such weights from denoising progress
in diffusion LMs; for autoregressive models we ship the entropy-based rule below.

Adding a weighting: register a function here and name it in `algorithm.token_weighting`, e.g.

    @TOKEN_WEIGHTS.register("late_tokens")
    def late_tokens(entropy_BT, mask_BT, frac=0.2):
        pos_BT = mask_BT.cumsum(-1)
        return (pos_BT > frac * mask_BT.sum(-1, keepdim=True)).float() * mask_BT

The trainer computes the weights per micro-batch, from the current policy's (detached) entropies.
"""

from __future__ import annotations

from typing import Protocol

import torch

from posttrain.algos.registry import Registry


class TokenWeighting(Protocol):
    def __call__(self, entropy_BT: torch.Tensor, mask_BT: torch.Tensor, frac: float = ...) -> torch.Tensor: ...


TOKEN_WEIGHTS: Registry[TokenWeighting] = Registry("token weighting")


@TOKEN_WEIGHTS.register("none")
def uniform(entropy_BT: torch.Tensor, mask_BT: torch.Tensor, frac: float = 1.0) -> torch.Tensor:
    """w_t = 1 on every loss token."""
    return mask_BT.float()


@TOKEN_WEIGHTS.register("high_entropy")
def high_entropy(entropy_BT: torch.Tensor, mask_BT: torch.Tensor, frac: float = 0.2) -> torch.Tensor:
    """Train only on the highest-entropy `frac` of tokens ("forking tokens"; Wang et al. 2025, "Beyond the 80/20
    Rule: High-Entropy Minority Tokens Drive Effective RL for LLM Reasoning", arXiv:2506.01939):

        w_t = 1[H_t >= quantile_{1 - frac}(H over the loss tokens)]

    Ties at the threshold are kept, so at least ceil(frac * n) tokens get weight 1.
    """
    if not 0 < frac <= 1:
        raise ValueError(f"frac must be in (0, 1], got {frac}")
    m = mask_BT.bool()
    if not bool(m.any()):
        return torch.zeros_like(entropy_BT, dtype=torch.float32)
    h = entropy_BT.detach().float()
    k = max(1, int(torch.ceil(torch.tensor(frac * int(m.sum()))).item()))
    threshold = torch.topk(h[m], k).values.min()
    return ((h >= threshold) & m).float()
