"""Policy losses: `fn(logp, old_logp, ref_logp, adv, mask, cfg) -> (loss, metrics)`.

Shapes: logp_BT, old_logp_BT, ref_logp_BT (or None), mask_BT over completion tokens; adv_B per sequence.
`cfg` (LossParams) carries the hyper-parameters, built once per run; `x` (LossInputs) the batch-wide normalizers
(see aggregation.py) and per-token weights, which change per micro-batch.

Every loss is A times something in its policy-gradient term, so with beta == 0 a sequence whose advantage is
0 contributes exactly 0 to the loss and to the gradient (the loop relies on this to skip such sequences).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from posttrain.algos.aggregation import aggregate
from posttrain.algos.kl import KL_ESTIMATORS, k3
from posttrain.algos.registry import Registry


class PolicyLoss(Protocol):
    def __call__(
        self,
        logp_BT: torch.Tensor,
        old_logp_BT: torch.Tensor,
        ref_logp_BT: torch.Tensor | None,
        adv_B: torch.Tensor,
        mask_BT: torch.Tensor,
        cfg: LossParams,
        x: LossInputs = ...,
    ) -> tuple[torch.Tensor, dict[str, float]]: ...


LOSSES: Registry[PolicyLoss] = Registry("policy loss")


@dataclass(frozen=True)
class LossParams:
    """The loss's hyper-parameters, built once from the config (see `loss_params`)."""

    epsilon: float = 0.2
    epsilon_high: float | None = None  # None: same as epsilon
    beta: float = 0.0
    kl_estimator: str = "k3"
    aggregation: str = "token-mean"
    max_tokens: int | None = None  # completion budget, for seq-mean-token-sum-norm
    # CISPO only: lower bound of the clipped IS weight is 1 - cispo_epsilon_low; None: no lower bound
    # (MiniMax-M1's setting). The upper bound is 1 + epsilon_high (or 1 + epsilon).
    cispo_epsilon_low: float | None = None
    # ppo_clip only: dual-clip constant c > 1 (Ye et al. 2020); bounds the loss of negative-advantage tokens whose
    # ratio exploded. None: off.
    dual_clip: float | None = None
    # On-policy distillation (algos/loss_terms.py `distill`, composed with the policy loss by `with_terms`): the
    # reverse-KL term's weight, and the weight of the RL term beside it (0: pure distillation).
    distill_coef: float = 0.0
    rl_weight: float = 1.0
    distill_prefix: str = "teacher"  # its metrics' prefix: teacher/ (a model), hint/ (the policy with a hint)


@dataclass(frozen=True)
class LossInputs:
    """What changes per micro-batch: the whole optimizer batch's normalizers (so gradient accumulation is exact;
    None: this call's own counts) and per-token credit weights."""

    total_tokens: float | None = None  # loss tokens in the whole optimizer batch
    total_seqs: float | None = None  # sequences in the whole optimizer batch
    # Per-token weights (TIS, DACA-GRPO style credit), shaped like (or broadcastable to) the logp_BT of *this
    # call*. Multiplied (detached) into the policy-gradient term of every loss before aggregation; the
    # KL-to-reference term is not weighted. None: all ones.
    token_weights_BT: Any = None
    # For the terms composed with the policy loss (algos/loss_terms.py): the teacher's log-probs of this call's
    # tokens (NaN where it has no opinion; None: no sequence here was scored by a teacher) and the entropy
    # bonus's coefficient (a remedy's; 0: off).
    teacher_logp_BT: Any = None
    entropy_coef: float = 0.0
    # Per row, the loss tokens of the episode it is a piece of (0: a whole sequence; None: no pieces in this call),
    # which a per-sequence mean divides by (algos/aggregation.py): an episode weighs the same however it was cut.
    seq_tokens_B: Any = None


NO_INPUTS = LossInputs()


def _masked_mean(x_BT: torch.Tensor, mask_BT: torch.Tensor) -> float:
    m = mask_BT.to(x_BT.dtype)
    return float((x_BT * m).sum() / m.sum().clamp(min=1))


def _eps(cfg: LossParams) -> tuple[float, float]:
    return cfg.epsilon, (cfg.epsilon_high if cfg.epsilon_high is not None else cfg.epsilon)


def _finish(
    pg_BT: torch.Tensor,
    logp_BT: torch.Tensor,
    ref_logp_BT: torch.Tensor | None,
    mask_BT: torch.Tensor,
    cfg: LossParams,
    x: LossInputs,
    metrics: dict[str, float],
    aggregation: str | None = None,
) -> torch.Tensor:
    """Shared tail of every loss: loss_t = w_t * pg_t + beta * KL_t, then `aggregate`."""
    if x.token_weights_BT is not None:
        w = torch.as_tensor(x.token_weights_BT, dtype=pg_BT.dtype, device=pg_BT.device).detach()
        try:
            fits = torch.broadcast_shapes(w.shape, pg_BT.shape) == pg_BT.shape
        except RuntimeError:
            fits = False
        if not fits:
            raise ValueError(f"token_weights_BT of shape {tuple(w.shape)} does not fit logp_BT {tuple(pg_BT.shape)}")
        pg_BT = pg_BT * w
    per_token = pg_BT
    if cfg.beta > 0:
        if ref_logp_BT is None:
            raise ValueError("beta > 0 needs reference log-probs")
        kl_BT = KL_ESTIMATORS[cfg.kl_estimator](logp_BT, ref_logp_BT)
        per_token = per_token + cfg.beta * kl_BT
        metrics["kl_ref"] = _masked_mean(kl_BT.detach(), mask_BT)
    return aggregate(
        per_token, mask_BT, aggregation or cfg.aggregation, x.total_tokens, x.total_seqs, cfg.max_tokens, x.seq_tokens_B
    )


@LOSSES.register("ppo_clip")
def ppo_clip_loss(
    logp_BT: torch.Tensor,
    old_logp_BT: torch.Tensor,
    ref_logp_BT: torch.Tensor | None,
    adv_B: torch.Tensor,
    mask_BT: torch.Tensor,
    cfg: LossParams,
    x: LossInputs = NO_INPUTS,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Token-level clipped surrogate (PPO, Schulman et al. 2017, arXiv:1707.06347; as used by GRPO), with
    DAPO's decoupled clip range (clip-higher, arXiv:2503.14476), optional dual clip (Ye et al. 2020, "Mastering
    Complex Control in MOBA Games with Deep RL", arXiv:1912.09729) and an optional KL-to-reference term:

        ratio  = exp(logp - old_logp)
        loss_t = max(-A * ratio, -A * clip(ratio, 1 - eps_low, 1 + eps_high))
        loss_t = min(loss_t, -A * c)            only where A < 0, when dual_clip c is set
        loss_t = loss_t + beta * KL_t
    """
    eps_low, eps_high = _eps(cfg)
    adv_BT = adv_B[:, None].to(logp_BT.dtype)
    log_ratio = logp_BT - old_logp_BT
    ratio = torch.exp(log_ratio)
    pg_loss1 = -adv_BT * ratio
    pg_loss2 = -adv_BT * torch.clamp(ratio, 1 - eps_low, 1 + eps_high)
    pg_loss = torch.max(pg_loss1, pg_loss2)
    if cfg.dual_clip is not None:
        if cfg.dual_clip <= 1:
            raise ValueError(f"dual_clip must be > 1, got {cfg.dual_clip}")
        pg_loss = torch.where(adv_BT < 0, torch.min(pg_loss, -adv_BT * cfg.dual_clip), pg_loss)
    metrics: dict[str, float] = {}
    loss = _finish(pg_loss, logp_BT, ref_logp_BT, mask_BT, cfg, x, metrics)
    with torch.no_grad():
        clipped_low = (ratio < 1 - eps_low) & (adv_BT < 0)
        clipped_high = (ratio > 1 + eps_high) & (adv_BT > 0)
        metrics.update(
            {
                "clipfrac_low": _masked_mean(clipped_low.float(), mask_BT),
                "clipfrac_high": _masked_mean(clipped_high.float(), mask_BT),
                "ratio_mean": _masked_mean(ratio, mask_BT),
                # approx KL(old || new), k3 form: http://joschu.net/blog/kl-approx.html
                "approx_kl": _masked_mean(k3(log_ratio), mask_BT),
            }
        )
    return loss, metrics


@LOSSES.register("reinforce")
def reinforce_loss(
    logp_BT: torch.Tensor,
    old_logp_BT: torch.Tensor,
    ref_logp_BT: torch.Tensor | None,
    adv_B: torch.Tensor,
    mask_BT: torch.Tensor,
    cfg: LossParams,
    x: LossInputs = NO_INPUTS,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Vanilla policy gradient (REINFORCE, Williams 1992), no importance ratio and no clipping; on-policy only
    (old_logp is ignored):

        loss_t = -A * logp_t + beta * KL_t
    """
    adv_BT = adv_B[:, None].to(logp_BT.dtype)
    pg_loss = -adv_BT * logp_BT
    metrics: dict[str, float] = {}
    loss = _finish(pg_loss, logp_BT, ref_logp_BT, mask_BT, cfg, x, metrics)
    return loss, metrics


@LOSSES.register("cispo")
def cispo_loss(
    logp_BT: torch.Tensor,
    old_logp_BT: torch.Tensor,
    ref_logp_BT: torch.Tensor | None,
    adv_B: torch.Tensor,
    mask_BT: torch.Tensor,
    cfg: LossParams,
    x: LossInputs = NO_INPUTS,
) -> tuple[torch.Tensor, dict[str, float]]:
    """CISPO, clipped IS-weight policy optimization (MiniMax-M1, arXiv:2506.13585, eq. 4-5):

        ratio  = exp(logp - old_logp)
        w_t    = sg(clip(ratio, 1 - eps_low_IS, 1 + eps_high))      sg = stop-gradient (detach)
        loss_t = -w_t * A * logp_t + beta * KL_t

    Unlike PPO, clipping bounds the *weight* but never drops a token's gradient: d loss_t / d logp_t = -w_t * A.
    eps_high: cfg.epsilon_high (or cfg.epsilon). eps_low_IS: cfg.cispo_epsilon_low; None (default) means no lower
    bound, as in the paper, which only tunes the upper one.
    """
    _, eps_high = _eps(cfg)
    low = 1 - cfg.cispo_epsilon_low if cfg.cispo_epsilon_low is not None else None
    adv_BT = adv_B[:, None].to(logp_BT.dtype)
    log_ratio = (logp_BT - old_logp_BT).detach()
    ratio = torch.exp(log_ratio)
    is_weight = torch.clamp(ratio, min=low, max=1 + eps_high).detach()
    pg_loss = -is_weight * adv_BT * logp_BT
    metrics: dict[str, float] = {}
    loss = _finish(pg_loss, logp_BT, ref_logp_BT, mask_BT, cfg, x, metrics)
    with torch.no_grad():
        metrics.update(
            {
                "clipfrac_low": _masked_mean(
                    (ratio < low).float() if low is not None else torch.zeros_like(ratio), mask_BT
                ),
                "clipfrac_high": _masked_mean((ratio > 1 + eps_high).float(), mask_BT),
                "ratio_mean": _masked_mean(ratio, mask_BT),
                "approx_kl": _masked_mean(k3(log_ratio), mask_BT),
            }
        )
    return loss, metrics


@LOSSES.register("gspo")
def gspo_loss(
    logp_BT: torch.Tensor,
    old_logp_BT: torch.Tensor,
    ref_logp_BT: torch.Tensor | None,
    adv_B: torch.Tensor,
    mask_BT: torch.Tensor,
    cfg: LossParams,
    x: LossInputs = NO_INPUTS,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO, group sequence policy optimization (Qwen, arXiv:2507.18071, eq. 5-7): one length-normalised
    importance ratio per sequence, clipped per sequence:

        s_i    = exp(1/|y_i| * sum_t (logp_t - old_logp_t))
        loss_i = max(-A_i * s_i, -A_i * clip(s_i, 1 - eps_low, 1 + eps_high))

    Written in the paper's GSPO-token form, s_it = sg(s_i) * exp(logp_t - sg(logp_t)): same value as s_i, and
    with seq-mean-token-mean aggregation the same gradient (d s_i / d logp_t = s_i / |y_i|), while per-token
    weights (cfg.token_weights_BT) can still act per token. The aggregation is always per sequence
    (seq-mean-token-mean, i.e. sum_i loss_i / total_seqs); cfg.aggregation is ignored. Like verl, the sequence
    log-ratio is clamped at 10 for numerical safety. The paper uses much smaller eps (about 3e-4 / 4e-4).
    """
    eps_low, eps_high = _eps(cfg)
    adv_BT = adv_B[:, None].to(logp_BT.dtype)
    m_BT = mask_BT.to(logp_BT.dtype)
    log_ratio = ((logp_BT - old_logp_BT) * m_BT).detach()
    log_s_B = torch.clamp(log_ratio.sum(-1) / m_BT.sum(-1).clamp(min=1), max=10.0)
    s_BT = torch.exp(log_s_B[:, None] + logp_BT - logp_BT.detach())  # s_it: value s_i, grad per token
    pg_loss1 = -adv_BT * s_BT
    pg_loss2 = -adv_BT * torch.clamp(s_BT, 1 - eps_low, 1 + eps_high)
    metrics: dict[str, float] = {}
    loss = _finish(
        torch.max(pg_loss1, pg_loss2), logp_BT, ref_logp_BT, mask_BT, cfg, x, metrics, aggregation="seq-mean-token-mean"
    )
    with torch.no_grad():
        s_B, adv = torch.exp(log_s_B), adv_B.to(logp_BT.dtype)
        has_tokens = (m_BT.sum(-1) > 0).to(s_B.dtype)
        n = has_tokens.sum().clamp(min=1)
        metrics.update(
            {
                "clipfrac_low": float((((s_B < 1 - eps_low) & (adv < 0)) * has_tokens).sum() / n),
                "clipfrac_high": float((((s_B > 1 + eps_high) & (adv > 0)) * has_tokens).sum() / n),
                "seq_ratio_mean": float((s_B * has_tokens).sum() / n),
                "seq_ratio_max": float(s_B[has_tokens > 0].max()) if bool(has_tokens.any()) else 1.0,
            }
        )
    return loss, metrics
