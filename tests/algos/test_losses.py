import math
from dataclasses import replace

import pytest
import torch

from posttrain.algos import KL_ESTIMATORS, LOSSES, LossInputs, LossParams, aggregate, kl_reward_penalty


def test_ppo_clip_hand_computed():
    # One sequence, two tokens. ratio = e^{0.5} ~ 1.6487 on token 0 (clipped at 1.2 for A>0), 1 on token 1.
    logp = torch.tensor([[0.5, 0.0]], requires_grad=True)
    old = torch.zeros(1, 2)
    adv = torch.tensor([2.0])
    mask = torch.ones(1, 2)
    loss, m = LOSSES["ppo_clip"](logp, old, None, adv, mask, LossParams(epsilon=0.2))
    # token 0: max(-2*1.6487, -2*1.2) = -2.4 ; token 1: -2*1 = -2 ; token-mean = -2.2
    assert loss.item() == pytest.approx(-2.2, abs=1e-5)
    assert m["clipfrac_high"] == pytest.approx(0.5)
    loss.backward()
    # The clipped token has no gradient; the unclipped one has d/dlogp (-A * e^{logp}) = -2.
    assert logp.grad[0, 0].item() == 0.0
    assert logp.grad[0, 1].item() == pytest.approx(-2.0 / 2)


def test_clip_higher_uses_epsilon_high():
    logp = torch.tensor([[math.log(1.25)]])
    cfg = LossParams(epsilon=0.2, epsilon_high=0.28)
    loss, m = LOSSES["ppo_clip"](logp, torch.zeros(1, 1), None, torch.tensor([1.0]), torch.ones(1, 1), cfg)
    assert loss.item() == pytest.approx(-1.25, abs=1e-5)  # 1.25 < 1.28: not clipped
    assert m["clipfrac_high"] == 0.0


def test_negative_advantage_clips_low():
    logp = torch.tensor([[math.log(0.5)]], requires_grad=True)
    loss, m = LOSSES["ppo_clip"](logp, torch.zeros(1, 1), None, torch.tensor([-1.0]), torch.ones(1, 1), LossParams())
    assert loss.item() == pytest.approx(0.8, abs=1e-5)  # max(0.5, 0.8)
    assert m["clipfrac_low"] == 1.0


def test_on_policy_gradient_is_policy_gradient():
    torch.manual_seed(0)
    logp = torch.randn(3, 4, requires_grad=True)
    adv = torch.tensor([1.0, -0.5, 2.0])
    mask = torch.ones(3, 4)
    loss, _ = LOSSES["ppo_clip"](logp, logp.detach(), None, adv, mask, LossParams())
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
    cfg = LossParams(beta=0.1)
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


def _batch(seed=0, B=3, T=5):
    g = torch.Generator().manual_seed(seed)
    logp = (-torch.rand(B, T, generator=g) * 2).requires_grad_()
    old = logp.detach() + 0.3 * torch.randn(B, T, generator=g)
    ref = logp.detach() + 0.3 * torch.randn(B, T, generator=g)
    mask = torch.ones(B, T)
    mask[0, 3:] = 0  # a shorter sequence
    return logp, old, ref, mask


def test_new_losses_are_registered():
    assert {"ppo_clip", "reinforce", "cispo", "gspo"} <= set(LOSSES.names())


def test_ppo_clip_at_ratio_one_has_the_reinforce_gradient():
    logp, _, _, mask = _batch()
    adv = torch.tensor([1.0, -0.5, 2.0])
    grads = []
    for name in ("ppo_clip", "reinforce"):
        x = logp.detach().clone().requires_grad_()
        loss, _ = LOSSES[name](x, x.detach(), None, adv, mask, LossParams(aggregation="token-mean"))
        loss.backward()
        grads.append(x.grad)
    assert torch.allclose(grads[0], grads[1])
    assert torch.allclose(grads[1], -adv[:, None] * mask / mask.sum())


def test_reinforce_hand_computed():
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    loss, _ = LOSSES["reinforce"](logp, torch.zeros(1, 2), None, torch.tensor([3.0]), torch.ones(1, 2), LossParams())
    assert loss.item() == pytest.approx(-3.0 * (-1.0 - 2.0) / 2)  # old_logp is ignored


def test_cispo_clipped_weight_still_passes_gradient():
    # ratios e^{0.5} ~ 1.65 (above 1 + 0.28) and e^{-1} ~ 0.37 (no lower bound by default) and 1.
    logp = torch.tensor([[0.5, -1.0, 0.0]], requires_grad=True)
    old, adv, mask = torch.zeros(1, 3), torch.tensor([2.0]), torch.ones(1, 3)
    cfg = LossParams(epsilon=0.2, epsilon_high=0.28)
    loss, m = LOSSES["cispo"](logp, old, None, adv, mask, cfg)
    w = torch.tensor([1.28, math.exp(-1.0), 1.0])
    assert loss.item() == pytest.approx(float((-w * 2.0 * logp.detach()).sum() / 3), abs=1e-6)
    loss.backward()
    assert torch.allclose(logp.grad, -w * 2.0 / 3)  # non-zero even where PPO would have clipped it away
    assert m["clipfrac_high"] == pytest.approx(1 / 3) and m["clipfrac_low"] == 0.0
    # An explicit lower bound clips the small weight to 1 - 0.2 (gradient still flows).
    x = logp.detach().clone().requires_grad_()
    loss, m = LOSSES["cispo"](x, old, None, adv, mask, LossParams(epsilon_high=0.28, cispo_epsilon_low=0.2))
    loss.backward()
    assert torch.allclose(x.grad, -torch.tensor([1.28, 0.8, 1.0]) * 2.0 / 3)
    assert m["clipfrac_low"] == pytest.approx(1 / 3)


def test_gspo_sequence_ratio_is_exp_mean_token_log_ratio():
    logp = torch.tensor([[0.1, -0.3, 0.5, 9.0], [0.0, 0.0, 0.0, 0.0]], requires_grad=True)
    old = torch.tensor([[0.0, 0.0, 0.2, 0.0], [0.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])  # the 9.0 is padding: ignored
    adv = torch.tensor([-1.0, 0.5])
    loss, m = LOSSES["gspo"](logp, old, None, adv, mask, LossParams(epsilon=0.2))
    s0 = math.exp((0.1 - 0.3 + 0.3) / 3)  # ~1.034, inside [0.8, 1.2]
    assert m["seq_ratio_mean"] == pytest.approx((s0 + 1.0) / 2, abs=1e-6)
    assert m["seq_ratio_max"] == pytest.approx(s0, abs=1e-6)
    # loss = sum_i max(-A s, -A clip(s)) / n_seqs, whatever cfg.aggregation says
    assert loss.item() == pytest.approx((1.0 * s0 - 0.5 * 1.0) / 2, abs=1e-6)
    loss.backward()
    # d/dlogp_t (-A_i s_i) / n_seqs = -A_i * s_i / |y_i| / n_seqs, the same for every token of a sequence
    expected = torch.tensor([[s0 / 3 / 2] * 3 + [0.0], [-0.5 / 2 / 2] * 2 + [0.0, 0.0]])
    assert torch.allclose(logp.grad, expected, atol=1e-6)


def test_gspo_clips_whole_sequence():
    logp = torch.tensor([[0.6, 0.6]], requires_grad=True)  # s = e^{0.6} ~ 1.82 > 1.2
    loss, m = LOSSES["gspo"](logp, torch.zeros(1, 2), None, torch.tensor([1.0]), torch.ones(1, 2), LossParams())
    assert loss.item() == pytest.approx(-1.2, abs=1e-6)
    assert m["clipfrac_high"] == 1.0
    loss.backward()
    assert torch.all(logp.grad == 0)


@pytest.mark.parametrize("name", LOSSES.names())
@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_zero_advantage_gives_zero_loss_and_gradient(name, aggregation):
    logp, old, ref, mask = _batch(seed=1)
    adv = torch.tensor([0.0, 1.5, -0.7])
    w = torch.rand(3, 5) + 0.5
    cfg = LossParams(aggregation=aggregation, epsilon_high=0.28, max_tokens=5)
    x = LossInputs(token_weights_BT=w, total_tokens=13.0, total_seqs=3.0)
    loss0, _ = LOSSES[name](logp[:1], old[:1], ref[:1], adv[:1], mask[:1], cfg, replace(x, token_weights_BT=w[:1]))
    loss0.backward()
    assert loss0.item() == 0.0
    assert torch.all(logp.grad == 0)
    # ... and leaving that sequence out changes neither the loss nor the other sequences' gradients.
    full, _ = LOSSES[name](logp, old, ref, adv, mask, cfg, x)
    (g_full,) = torch.autograd.grad(full, logp)
    part, _ = LOSSES[name](logp[1:], old[1:], ref[1:], adv[1:], mask[1:], cfg, replace(x, token_weights_BT=w[1:]))
    (g_part,) = torch.autograd.grad(part, logp)
    assert full.item() == pytest.approx(part.item(), abs=1e-6)
    assert torch.allclose(g_full, g_part, atol=1e-7)


@pytest.mark.parametrize("name", LOSSES.names())
def test_token_weights_scale_the_gradient(name):
    logp, old, ref, mask = _batch(seed=2)
    adv = torch.tensor([1.0, -2.0, 0.5])
    w = torch.rand(3, 5, generator=torch.Generator().manual_seed(3)) * 2
    cfg = LossParams(epsilon=10.0)  # wide clip range: ppo_clip/gspo keep every gradient
    (g1,) = torch.autograd.grad(LOSSES[name](logp, old, ref, adv, mask, cfg)[0], logp)
    (gw,) = torch.autograd.grad(LOSSES[name](logp, old, ref, adv, mask, cfg, LossInputs(token_weights_BT=w))[0], logp)
    assert torch.allclose(gw, w * g1, atol=1e-6)
    with pytest.raises(ValueError):
        LOSSES[name](logp, old, ref, adv, mask, cfg, LossInputs(token_weights_BT=torch.ones(2, 5)))


@pytest.mark.parametrize("name", LOSSES.names())
def test_micro_batches_sum_to_full_batch(name):
    logp, old, ref, mask = _batch(seed=4)
    adv = torch.tensor([1.0, -2.0, 0.5])
    cfg, x = LossParams(beta=0.05), LossInputs(total_tokens=float(mask.sum()), total_seqs=3.0)
    full, _ = LOSSES[name](logp, old, ref, adv, mask, cfg, x)
    parts = sum(LOSSES[name](logp[i:i + 1], old[i:i + 1], ref[i:i + 1], adv[i:i + 1], mask[i:i + 1], cfg, x)[0]
                for i in range(3))
    assert full.item() == pytest.approx(parts.item(), abs=1e-6)


@pytest.mark.parametrize("name", LOSSES.names())
def test_kl_term_for_every_loss(name):
    logp, ref = torch.tensor([[-1.0]]), torch.tensor([[-1.5]])
    loss, m = LOSSES[name](logp, logp, ref, torch.tensor([0.0]), torch.ones(1, 1), LossParams(beta=0.1))
    assert loss.item() == pytest.approx(0.1 * (math.exp(-0.5) - 1 + 0.5), abs=1e-6)
    assert "kl_ref" in m
    with pytest.raises(ValueError):
        LOSSES[name](logp, logp, None, torch.tensor([0.0]), torch.ones(1, 1), LossParams(beta=0.1))


def test_kl_reward_penalty_sums_beta_kl_per_sequence():
    logp = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, 0.0]], requires_grad=True)
    ref = torch.tensor([[-1.5, -1.0, 0.0], [-0.5, -1.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    pen = kl_reward_penalty(logp, ref, mask, 0.5, "k1")
    assert torch.allclose(pen, torch.tensor([0.5 * (0.5 - 1.0), 0.5 * (0.0 + 0.5 + 0.0)]))
    assert not pen.requires_grad
    k3 = kl_reward_penalty(logp, ref, mask, 2.0, "k3")
    assert torch.allclose(k3, 2.0 * (KL_ESTIMATORS["k3"](logp, ref) * mask).sum(-1))


def test_dual_clip_bounds_negative_advantage_loss():
    # ratio e^2 ~ 7.39 with A = -1: PPO loss = max(7.39, 1.2) = 7.39; dual clip c = 3 caps it at 3
    logp = torch.tensor([[2.0, 0.0]], requires_grad=True)
    old = torch.zeros(1, 2)
    mask = torch.ones(1, 2)
    cfg = LossParams(dual_clip=3.0, aggregation="token-mean")
    loss, _ = LOSSES["ppo_clip"](logp, old, None, torch.tensor([-1.0]), mask, cfg)
    assert float(loss) == pytest.approx((3.0 + 1.0) / 2)
    loss.backward()
    assert logp.grad[0, 0] == 0  # the capped token passes no gradient
    # positive advantages are untouched by the dual clip
    l_pos, _ = LOSSES["ppo_clip"](logp.detach(), old, None, torch.tensor([1.0]), mask, cfg)
    l_ref, _ = LOSSES["ppo_clip"](logp.detach(), old, None, torch.tensor([1.0]), mask, LossParams())
    assert float(l_pos) == float(l_ref)
    with pytest.raises(ValueError):
        LOSSES["ppo_clip"](logp.detach(), old, None, torch.tensor([-1.0]), mask, LossParams(dual_clip=0.5))
