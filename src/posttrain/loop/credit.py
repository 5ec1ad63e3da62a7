"""Per-step reward shaping and per-token weighting, assembled from the config out of algos/ functions.

The loop calls these; the trainer only sees a token-weight function and a batch. No math lives here beyond
plumbing: overlong penalties, KL-as-reward, importance-sampling correction and credit weights are all in algos/.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from posttrain.algos.dapo import overlong_keep_mask, soft_overlong_penalty
from posttrain.algos.kl import kl_reward_penalty
from posttrain.algos.off_policy import mask_by_ratio, tis_weights
from posttrain.algos.token_weights import TOKEN_WEIGHTS
from posttrain.config.schema import AlgorithmConfig
from posttrain.train.trainer import TokenWeightFn
from posttrain.types import Batch, Group


def apply_overlong_penalty(groups: list[Group], a: AlgorithmConfig, max_tokens: int) -> float:
    """DAPO soft overlong punishment, added to each trajectory's reward. Returns the mean penalty."""
    buffer = round(a.overlong_buffer_frac * max_tokens)
    if buffer <= 0:
        return 0.0
    trajs = [t for g in groups for t in g.trajectories_G]
    lengths = torch.tensor([t.num_completion_tokens for t in trajs])
    pen = soft_overlong_penalty(lengths, max_tokens, buffer, a.overlong_penalty)
    for t, p in zip(trajs, pen.tolist()):
        if p != 0.0:
            t.reward += p
            t.reward_components["overlong_penalty"] = p
    return float(pen.mean()) if len(trajs) else 0.0


def filter_overlong(groups: list[Group], batch: Batch) -> int:
    """DAPO overlong filtering: zero the loss mask of truncated samples. Returns how many were filtered.

    Walks the trajectories in the order groups_to_batch emitted them (failed ones were left out)."""
    trajs = [t for g in groups for t in g.trajectories_G if not t.failed]
    keep = overlong_keep_mask([t.turns[-1].finish_reason for t in trajs])
    n = 0
    for s, k in zip(batch.sequences, keep):
        if not k:
            s.loss_mask = [0] * len(s.loss_mask)
            n += 1
    return n


def kl_penalties(batch: Batch, ref_logprobs: list[list[float]], beta: float, estimator: str) -> list[float]:
    """KL-to-reference as a per-sequence reward penalty, estimated on the sampler's log-probs of its own tokens."""
    T = max((len(s.completion_ids) for s in batch.sequences), default=0)
    if T == 0:
        return [0.0] * len(batch.sequences)
    logp = torch.zeros(len(batch.sequences), T)
    ref = torch.zeros_like(logp)
    mask = torch.zeros_like(logp)
    for i, (s, r) in enumerate(zip(batch.sequences, ref_logprobs)):
        n = len(s.completion_ids)
        logp[i, :n] = torch.tensor(s.sampler_logprobs)
        ref[i, :n] = torch.tensor(r)
        mask[i, :n] = torch.tensor(s.loss_mask, dtype=torch.float32)
    return kl_reward_penalty(logp, ref, mask, beta, estimator).tolist()


def token_weight_fn(a: AlgorithmConfig) -> TokenWeightFn | None:
    """Compose importance-sampling correction and credit weights into one per-micro-batch function."""
    if a.is_correction == "none" and a.token_weighting == "none":
        return None
    credit: Callable | None = TOKEN_WEIGHTS[a.token_weighting] if a.token_weighting != "none" else None

    def fn(logp_BT, sampler_BT, entropy_BT, mask_BT):
        w_BT = None
        metrics: dict[str, float] = {}
        if a.is_correction == "truncate":
            w_BT, m = tis_weights(logp_BT, sampler_BT, mask_BT, cap=a.is_cap, level=a.is_level)
            metrics.update({f"is/{k}": v for k, v in m.items()})
        elif a.is_correction == "mask":
            w_BT, m = mask_by_ratio(logp_BT, sampler_BT, mask_BT, threshold=a.is_cap, level=a.is_level)
            w_BT = w_BT.float()
            metrics.update({f"is/{k}": v for k, v in m.items()})
        if credit is not None:
            c_BT = credit(entropy_BT, mask_BT, frac=a.token_weighting_frac)
            metrics["credit/weighted_token_frac"] = float((c_BT > 0).sum() / mask_BT.sum().clamp(min=1))
            w_BT = c_BT if w_BT is None else w_BT * c_BT
        return w_BT, metrics

    return fn
