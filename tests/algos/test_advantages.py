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
