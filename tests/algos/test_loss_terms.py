"""Loss terms composed with the policy loss (algos/loss_terms.py): with no term applying, the composed loss is the
policy loss bit for bit; each term adds exactly its own value; rl_weight scales only the policy term."""

import math

import pytest
import torch

from posttrain.algos import LOSSES, LossInputs, LossParams
from posttrain.algos.distill import reverse_kl_loss
from posttrain.algos.loss_terms import TERMS, with_terms


def _case(seed=0, B=3, T=5):
    g = torch.Generator().manual_seed(seed)
    logp = (-torch.rand(B, T, generator=g) * 3).requires_grad_(True)
    old = logp.detach() + 0.05 * torch.randn(B, T, generator=g)
    mask = (torch.rand(B, T, generator=g) > 0.2).float()
    adv = torch.randn(B, generator=g)
    return logp, old, mask, adv


@pytest.mark.parametrize("name", LOSSES.names())
def test_no_term_applying_gives_the_policy_loss_exactly(name):
    logp, old, mask, adv = _case()
    params, inputs = LossParams(), LossInputs(total_tokens=float(mask.sum()), total_seqs=3.0)
    want, wm = LOSSES[name](logp, old, None, adv, mask, params, inputs)
    got, gm = with_terms(LOSSES[name])(logp, old, None, adv, mask, params, inputs)
    assert torch.equal(got, want) and gm == wm


def test_the_distill_term_adds_the_reverse_kl_and_skips_tokens_without_an_opinion():
    logp, old, mask, adv = _case(1)
    teacher = old - 0.3
    teacher[0] = float("nan")  # no opinion on the first sequence
    params = LossParams(distill_coef=0.5, distill_prefix="hint")
    inputs = LossInputs(total_tokens=float(mask.sum()), total_seqs=3.0, teacher_logp_BT=teacher)
    pol, _ = LOSSES["ppo_clip"](logp, old, None, adv, mask, params, inputs)
    got, m = with_terms(LOSSES["ppo_clip"])(logp, old, None, adv, mask, params, inputs)
    filled = torch.where(torch.isnan(teacher), old, teacher)
    kl, _ = reverse_kl_loss(logp, old, filled, mask, 0.5, "token-mean", float(mask.sum()), 3.0)
    assert torch.allclose(got, pol + kl) and set(m) >= {"hint/kl", "hint/logp"}
    assert m["hint/kl"] == pytest.approx(0.3, abs=1e-5)  # measured only where the teacher scored
    none, _ = TERMS["distill"](logp, old, mask, LossParams(distill_coef=0.0), inputs)
    assert none is None  # coefficient 0: the term does not apply


def test_rl_weight_scales_the_policy_term_only():
    logp, old, mask, adv = _case(2)
    teacher = old - 0.1
    inputs = LossInputs(total_tokens=float(mask.sum()), total_seqs=3.0, teacher_logp_BT=teacher)
    only_distill, _ = with_terms(LOSSES["ppo_clip"])(logp, old, None, adv, mask,
                                                    LossParams(distill_coef=1.0, rl_weight=0.0), inputs)
    kl, _ = TERMS["distill"](logp, old, mask, LossParams(distill_coef=1.0), inputs)
    assert torch.allclose(only_distill, kl)


def test_the_entropy_bonus_applies_only_with_a_coefficient():
    logp, old, mask, adv = _case(3)
    tot = float(mask.sum())
    off, m_off = TERMS["entropy_bonus"](logp, old, mask, LossParams(), LossInputs(total_tokens=tot))
    on, m_on = TERMS["entropy_bonus"](logp, old, mask, LossParams(), LossInputs(total_tokens=tot, entropy_coef=0.2))
    assert off is None and m_off == {}
    assert math.isclose(float(on), 0.2 * float((logp.detach() * logp * mask).sum()) / tot, rel_tol=1e-6)
    assert m_on == {"entropy_bonus": 0.2}


def test_an_unknown_term_is_refused_with_the_registry_message():
    with pytest.raises(KeyError, match="loss term"):
        with_terms(LOSSES["ppo_clip"], ("distil",))
