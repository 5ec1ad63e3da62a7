import math

import pytest
import torch

from posttrain.algos import KL_ESTIMATORS, LOSSES, LossConfig, aggregate


def test_ppo_clip_hand_computed():
    # One sequence, two tokens. ratio = e^{0.5} ~ 1.6487 on token 0 (clipped at 1.2 for A>0), 1 on token 1.
    logp = torch.tensor([[0.5, 0.0]], requires_grad=True)
    old = torch.zeros(1, 2)
    adv = torch.tensor([2.0])
    mask = torch.ones(1, 2)
    loss, m = LOSSES["ppo_clip"](logp, old, None, adv, mask, LossConfig(epsilon=0.2))
    # token 0: max(-2*1.6487, -2*1.2) = -2.4 ; token 1: -2*1 = -2 ; token-mean = -2.2
    assert loss.item() == pytest.approx(-2.2, abs=1e-5)
    assert m["clipfrac_high"] == pytest.approx(0.5)
    loss.backward()
    # The clipped token has no gradient; the unclipped one has d/dlogp (-A * e^{logp}) = -2.
    assert logp.grad[0, 0].item() == 0.0
    assert logp.grad[0, 1].item() == pytest.approx(-2.0 / 2)


def test_clip_higher_uses_epsilon_high():
    logp = torch.tensor([[math.log(1.25)]])
    cfg = LossConfig(epsilon=0.2, epsilon_high=0.28)
    loss, m = LOSSES["ppo_clip"](logp, torch.zeros(1, 1), None, torch.tensor([1.0]), torch.ones(1, 1), cfg)
    assert loss.item() == pytest.approx(-1.25, abs=1e-5)  # 1.25 < 1.28: not clipped
    assert m["clipfrac_high"] == 0.0


def test_negative_advantage_clips_low():
    logp = torch.tensor([[math.log(0.5)]], requires_grad=True)
    loss, m = LOSSES["ppo_clip"](logp, torch.zeros(1, 1), None, torch.tensor([-1.0]), torch.ones(1, 1), LossConfig())
    assert loss.item() == pytest.approx(0.8, abs=1e-5)  # max(0.5, 0.8)
    assert m["clipfrac_low"] == 1.0


def test_on_policy_gradient_is_policy_gradient():
    torch.manual_seed(0)
    logp = torch.randn(3, 4, requires_grad=True)
    adv = torch.tensor([1.0, -0.5, 2.0])
    mask = torch.ones(3, 4)
    loss, _ = LOSSES["ppo_clip"](logp, logp.detach(), None, adv, mask, LossConfig())
    loss.backward()
    # With ratio 1 the surrogate's gradient is -A / n_tokens per token (REINFORCE).
    assert torch.allclose(logp.grad, -adv[:, None].expand(3, 4) / 12)


def test_kl_estimators_hand_values_and_k3_nonnegative():
    logp = torch.tensor([-1.0, -2.0, -0.1])
    ref = torch.tensor([-1.5, -1.0, -0.1])
    assert torch.allclose(KL_ESTIMATORS["k1"](logp, ref), torch.tensor([0.5, -1.0, 0.0]))
    assert torch.allclose(KL_ESTIMATORS["k2"](logp, ref), torch.tensor([0.125, 0.5, 0.0]))
    k3 = KL_ESTIMATORS["k3"](logp, ref)
    assert torch.allclose(k3, torch.tensor([math.exp(-0.5) - 1 + 0.5, math.exp(1.0) - 1 - 1.0, 0.0]))
    assert (KL_ESTIMATORS["k3"](torch.randn(1000), torch.randn(1000)) >= 0).all()


def test_beta_adds_kl_term_and_needs_ref():
    logp = torch.tensor([[-1.0]])
    ref = torch.tensor([[-1.5]])
    cfg = LossConfig(beta=0.1)
    loss, m = LOSSES["ppo_clip"](logp, logp, ref, torch.tensor([0.0]), torch.ones(1, 1), cfg)
    assert loss.item() == pytest.approx(0.1 * (math.exp(-0.5) - 1 + 0.5), abs=1e-6)
    assert "kl_ref" in m
    with pytest.raises(ValueError):
        LOSSES["ppo_clip"](logp, logp, None, torch.tensor([0.0]), torch.ones(1, 1), cfg)


def test_aggregation_modes():
    loss = torch.tensor([[1.0, 1.0, 1.0, 0.0], [4.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    assert aggregate(loss, mask, "token-mean").item() == pytest.approx(7 / 4)
    assert aggregate(loss, mask, "seq-mean-token-mean").item() == pytest.approx((1 + 4) / 2)
    assert aggregate(loss, mask, "seq-mean-token-sum-norm", max_tokens=8).item() == pytest.approx((3 / 8 + 4 / 8) / 2)
    # Batch-wide normalizers make micro-batch sums equal the full-batch value.
    a = aggregate(loss[:1], mask[:1], "token-mean", total_tokens=4)
    b = aggregate(loss[1:], mask[1:], "token-mean", total_tokens=4)
    assert (a + b).item() == pytest.approx(7 / 4)
    with pytest.raises(KeyError):
        aggregate(loss, mask, "nope")
