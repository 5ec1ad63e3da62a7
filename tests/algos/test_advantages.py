import pytest
import torch

from posttrain.algos import ADVANTAGES, grpo_advantages


def test_grpo_centres_and_scales_per_group():
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 2.0, 4.0])
    g = torch.tensor([0, 0, 0, 0, 1, 1])
    adv = grpo_advantages(r, g, scale_std=True, eps=0.0)
    # group 0: mean 0.25, unbiased std sqrt(((.75)^2 + 3*(.25)^2)/3) = 0.5
    assert torch.allclose(adv[:4], torch.tensor([1.5, -0.5, -0.5, -0.5]))
    # group 1: mean 3, std sqrt(2)
    assert torch.allclose(adv[4:], torch.tensor([-1.0, 1.0]) / 2**0.5)


def test_grpo_without_std_scaling_is_mean_centred():
    r = torch.tensor([1.0, 3.0, 10.0, 10.0])
    g = torch.tensor([0, 0, 1, 1])
    adv = grpo_advantages(r, g, scale_std=False)
    assert torch.allclose(adv, torch.tensor([-1.0, 1.0, 0.0, 0.0]))


def test_zero_variance_group_gets_zero_advantage():
    adv = grpo_advantages(torch.tensor([0.7, 0.7, 0.7]), torch.tensor([5, 5, 5]))
    assert torch.all(adv == 0)


def test_registry_lookup_and_typo_message():
    assert ADVANTAGES["grpo"] is grpo_advantages
    try:
        ADVANTAGES["grop"]
    except KeyError as e:
        assert "did you mean 'grpo'" in str(e)
    else:
        raise AssertionError("expected KeyError")


def test_dr_grpo_ignores_scale_std():
    r = torch.tensor([1.0, 3.0, 0.0, 4.0])
    g = torch.tensor([0, 0, 1, 1])
    expected = torch.tensor([-1.0, 1.0, -2.0, 2.0])
    for scale in (True, False):
        assert torch.allclose(ADVANTAGES["dr_grpo"](r, g, scale_std=scale), expected)


def test_rloo_baseline_excludes_the_sample_itself():
    r = torch.tensor([1.0, 0.0, 0.0, 5.0, 2.0])
    g = torch.tensor([0, 0, 0, 1, 2])
    adv = ADVANTAGES["rloo"](r, g)
    # group 0: 1 - (0+0)/2 = 1 ; 0 - (1+0)/2 = -0.5 (twice) ; singleton groups 1 and 2 get 0
    assert torch.allclose(adv, torch.tensor([1.0, -0.5, -0.5, 0.0, 0.0]))
    # identity: A_i = n/(n-1) * (r_i - group mean), independent of scale_std
    r2, g2 = torch.tensor([0.3, 1.0, 0.2, 0.9]), torch.zeros(4, dtype=torch.long)
    assert torch.allclose(ADVANTAGES["rloo"](r2, g2, scale_std=False), 4 / 3 * (r2 - r2.mean()))


def test_reinforce_pp_normalises_over_the_batch():
    r = torch.tensor([1.0, 0.0, 10.0, 12.0])
    g = torch.tensor([0, 0, 1, 1])
    adv = ADVANTAGES["reinforce_pp"](r, g, eps=0.0)
    assert torch.allclose(adv, (r - r.mean()) / r.std())  # group ids play no part
    assert adv.mean().abs() < 1e-6 and adv.std().item() == pytest.approx(1.0)
    # group_baseline: centre per group -> [.5, -.5, -1, 1], then divide by that vector's batch std
    a = torch.tensor([0.5, -0.5, -1.0, 1.0])
    adv_b = ADVANTAGES["reinforce_pp"](r, g, eps=0.0, group_baseline=True)
    assert torch.allclose(adv_b, a / a.std())
    assert torch.allclose(ADVANTAGES["reinforce_pp"](r, g, scale_std=False), r - r.mean())
    assert ADVANTAGES["reinforce_pp"](torch.tensor([3.0]), torch.tensor([0])).item() == 0.0


def test_reward_estimator_is_the_reward_itself():
    r, g = torch.tensor([1.0, 1.0, -1.0, 0.25]), torch.tensor([0, 0, 1, 2])
    for scale in (True, False):
        adv = ADVANTAGES["reward"](r, g, scale_std=scale)
        assert torch.equal(adv, r) and adv is not r  # a new tensor: the caller's rewards are not aliased
