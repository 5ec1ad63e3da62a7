"""Loss terms added to a policy loss, and the composition the stepper hands the trainer.

    loss_fn = with_terms(LOSSES[name])            the policy loss, then every term in TERMS, in order
    loss, metrics = loss_fn(logp_BT, old_logp_BT, ref_logp_BT, adv_B, mask_BT, params, inputs)

A term is `fn(logp_BT, old_logp_BT, mask_BT, params, inputs) -> (loss or None, metrics)`: None when it does not
apply to this micro-batch (no teacher scored it, its coefficient is 0), so a run without it computes exactly
what it did before. What a term reads comes in `LossInputs`, filled by the trainer from the batch (the teacher's
log-probs are a field of each Sequence) and from its run-time settings (a remedy's entropy coefficient): the
trainer packs data, the terms decide what to do with it.

The policy loss sees the advantage scaled by `params.rl_weight` (on-policy distillation may weigh the RL term
down, or to 0 for pure distillation). Every term is aggregated with the batch-wide normalizers, so a term adds
under gradient accumulation exactly as the policy loss does.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from posttrain.algos.distill import reverse_kl_loss
from posttrain.algos.losses import LossInputs, LossParams
from posttrain.algos.registry import Registry

Term = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, LossParams, LossInputs], "tuple[torch.Tensor | None, dict[str, float]]"
]
TERMS: Registry[Term] = Registry("loss term")


@TERMS.register("distill")
def distill_term(
    logp_BT: torch.Tensor, old_logp_BT: torch.Tensor, mask_BT: torch.Tensor, params: LossParams, inputs: LossInputs
) -> tuple[torch.Tensor | None, dict[str, float]]:
    """On-policy distillation toward a teacher (algos/distill.py), weighted by `params.distill_coef`. A teacher may
    have no opinion on a sequence or a token (NaN in `inputs.teacher_logp_BT`): there the teacher equals the
    student's own behaviour log-prob, so the term is exactly 0 and its metrics skip those tokens. Metrics are
    named `<params.distill_prefix>/...` (teacher/ for a model, hint/ for the policy with a hint in context)."""
    teacher_BT = inputs.teacher_logp_BT
    if params.distill_coef <= 0 or teacher_BT is None:
        return None, {}
    opinion_BT = ~torch.isnan(teacher_BT)
    teacher_BT = torch.where(opinion_BT, teacher_BT, old_logp_BT.detach())
    loss, m = reverse_kl_loss(
        logp_BT,
        old_logp_BT,
        teacher_BT,
        mask_BT,
        params.distill_coef,
        params.aggregation,
        inputs.total_tokens,
        inputs.total_seqs,
        params.max_tokens,
        inputs.token_weights_BT,
        metric_mask_BT=mask_BT * opinion_BT,
        seq_tokens_B=inputs.seq_tokens_B,
    )
    return loss, {k.replace("teacher/", f"{params.distill_prefix}/", 1): v for k, v in m.items()}


@TERMS.register("entropy_bonus")
def entropy_bonus_term(
    logp_BT: torch.Tensor, old_logp_BT: torch.Tensor, mask_BT: torch.Tensor, params: LossParams, inputs: LossInputs
) -> tuple[torch.Tensor | None, dict[str, float]]:
    """A remedy's entropy bonus (obs/remedies.py), `inputs.entropy_coef` while it lasts.

    d/dθ H(π) = -E_y[log π(y) ∇ log π(y)] over the sampled tokens (score function; E[∇ log π] = 0), so
    `mean(logp.detach() * logp)` has minus the entropy's gradient: adding it raises entropy. No full-vocabulary
    entropy with a graph, and it aggregates over the batch's tokens like the loss."""
    if inputs.entropy_coef <= 0:
        return None, {}
    bonus = (logp_BT.detach() * logp_BT * mask_BT).sum() / max(inputs.total_tokens or 1.0, 1.0)
    return inputs.entropy_coef * bonus, {"entropy_bonus": float(inputs.entropy_coef)}


def with_terms(
    policy_loss: Callable[..., tuple[torch.Tensor, dict[str, float]]],
    terms: tuple[str, ...] = ("distill", "entropy_bonus"),
) -> Callable[..., tuple[torch.Tensor, dict]]:
    """The loss the trainer runs: `policy_loss` on the advantage times `params.rl_weight`, plus each term that
    applies, in the order named."""
    fns = [TERMS[t] for t in terms]

    def loss_fn(logp_BT, old_logp_BT, ref_logp_BT, adv_B, mask_BT, params: LossParams, inputs: LossInputs):
        loss, m = policy_loss(logp_BT, old_logp_BT, ref_logp_BT, adv_B * params.rl_weight, mask_BT, params, inputs)
        m = dict(m)
        for fn in fns:
            extra, tm = fn(logp_BT, old_logp_BT, mask_BT, params, inputs)
            if extra is not None:
                loss = loss + extra
                m.update(tm)
        return loss, m

    loss_fn.policy_loss = policy_loss  # what was composed, for a reader (and tests)
    loss_fn.terms = tuple(terms)
    return loss_fn
