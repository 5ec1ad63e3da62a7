"""Correcting for sampler/trainer mismatch: the inference engine (vLLM, ...) samples tokens with log-probs
`sampler_logp` that differ from the trainer's `logp` for the same weights (kernels, precision, stale weights).

Pure functions, no state. Ratio r = pi_trainer / pi_sampler, over the tokens the sampler drew:
    token level      r_bt = exp(logp_bt - sampler_logp_bt)
    sequence level   r_b  = exp(sum_t mask_bt * (logp_bt - sampler_logp_bt)), broadcast to the sequence's tokens

Truncated IS (Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training",
https://fengyao.notion.site/off-policy-rl) multiplies the per-token loss by min(r, cap); feed the weights as
`LossInputs.token_weights_BT`. Masked IS (Liu et al. 2025, "When Speed Kills Stability: Demystifying RL Collapse
from the Training-Inference Mismatch") instead drops tokens / sequences whose r is outside [1/threshold,
threshold]; use the returned mask as the loss mask (the batch's normalizers stay as they were).

Metrics: is_ratio_mean / is_ratio_max (of r at the chosen level, before capping; can be inf at sequence level),
is_capped_frac or is_masked_frac (over tokens, or over sequences at sequence level), and sampler_kl_k3: mean over
tokens of the k3 estimate of KL(sampler || trainer), r - 1 - log r, unbiased since the tokens come from the sampler.
"""

from __future__ import annotations

import math
from typing import Protocol

import torch

from posttrain.algos.kl import k3
from posttrain.algos.registry import Registry

LEVELS = ("token", "sequence")


def _log_ratio(
    logp_BT: torch.Tensor, sampler_logp_BT: torch.Tensor, mask_BT: torch.Tensor, level: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(log r broadcast to BT, token log-ratio, float mask), all detached, zero on padding."""
    m = mask_BT.to(torch.float32).to(logp_BT.device)
    tok_lr = torch.where(m > 0, (logp_BT.detach() - sampler_logp_BT.detach()).float(), torch.zeros_like(m))
    if level == "token":
        return tok_lr, tok_lr, m
    if level == "sequence":
        return tok_lr.sum(-1, keepdim=True).expand_as(tok_lr), tok_lr, m
    raise KeyError(f"unknown importance-sampling level {level!r} (known: {', '.join(LEVELS)})")


def _metrics(
    lr_BT: torch.Tensor, tok_lr: torch.Tensor, m: torch.Tensor, level: str, out_BT: torch.Tensor, out_name: str
) -> dict[str, float]:
    """Ratio stats over tokens (token level) or over sequences with tokens (sequence level)."""
    if level == "token":
        units, valid = lr_BT, m > 0
        frac = out_BT
    else:
        units, valid = lr_BT[:, 0], m.sum(-1) > 0
        frac = out_BT[:, 0]
    n = valid.sum().clamp(min=1)
    r = torch.exp(units)
    k3_BT = k3(tok_lr)
    return {
        "is_ratio_mean": float(torch.where(valid, r, torch.zeros_like(r)).sum() / n),
        "is_ratio_max": float(r[valid].max()) if bool(valid.any()) else 1.0,
        out_name: float((frac * valid).sum() / n),
        "sampler_kl_k3": float((k3_BT * m).sum() / m.sum().clamp(min=1)),
    }


def tis_weights(
    logp_BT: torch.Tensor, sampler_logp_BT: torch.Tensor, mask_BT: torch.Tensor, cap: float = 2.0, level: str = "token"
) -> tuple[torch.Tensor, dict[str, float]]:
    """Truncated importance-sampling weights, detached, 0 on padding:

    w = min(r, cap)     r at `level` (see module doc); computed as exp(min(log r, log cap)), no overflow
    """
    lr_BT, tok_lr, m = _log_ratio(logp_BT, sampler_logp_BT, mask_BT, level)
    weights_BT = torch.exp(torch.clamp(lr_BT, max=math.log(cap))) * m
    capped = (lr_BT > math.log(cap)).float()
    return weights_BT, _metrics(lr_BT, tok_lr, m, level, capped, "is_capped_frac")


def mask_by_ratio(
    logp_BT: torch.Tensor,
    sampler_logp_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    threshold: float = 2.0,
    level: str = "token",
) -> tuple[torch.Tensor, dict[str, float]]:
    """Masked importance sampling: keep a token (or, at sequence level, a whole sequence) only if

        1/threshold <= r <= threshold

    Returns mask_BT with the dropped tokens zeroed (same dtype as mask_BT) and metrics.
    """
    if threshold < 1:
        raise ValueError(f"threshold must be >= 1, got {threshold}")
    lr_BT, tok_lr, m = _log_ratio(logp_BT, sampler_logp_BT, mask_BT, level)
    bound = math.log(threshold)
    outside = (lr_BT.abs() > bound).float()
    keep_BT = (m * (1 - outside)).to(mask_BT.dtype)
    return keep_BT, _metrics(lr_BT, tok_lr, m, level, outside, "is_masked_frac")


# The `algorithm.is_correction` choices: `fn(logp_BT, sampler_logp_BT, mask_BT, cap, level) -> (weights_BT or None,
# metrics)`. The weights multiply the policy-gradient term (LossInputs.token_weights_BT).
class ISCorrection(Protocol):
    def __call__(
        self,
        logp_BT: torch.Tensor,
        sampler_logp_BT: torch.Tensor,
        mask_BT: torch.Tensor,
        cap: float = ...,
        level: str = ...,
    ) -> tuple[torch.Tensor | None, dict[str, float]]: ...


IS_CORRECTIONS: Registry[ISCorrection] = Registry("importance-sampling correction")


@IS_CORRECTIONS.register("none")
def no_correction(logp_BT, sampler_logp_BT, mask_BT, cap=2.0, level="token"):
    return None, {}


@IS_CORRECTIONS.register("truncate")
def truncate_correction(logp_BT, sampler_logp_BT, mask_BT, cap=2.0, level="token"):
    return tis_weights(logp_BT, sampler_logp_BT, mask_BT, cap=cap, level=level)


@IS_CORRECTIONS.register("mask")
def mask_correction(logp_BT, sampler_logp_BT, mask_BT, cap=2.0, level="token"):
    keep_BT, m = mask_by_ratio(logp_BT, sampler_logp_BT, mask_BT, threshold=cap, level=level)
    return keep_BT.float(), m
