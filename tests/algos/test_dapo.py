import pytest
import torch

from posttrain.algos.dapo import has_signal, overlong_keep_mask, soft_overlong_penalty


def test_soft_overlong_penalty_matches_dapo_eq13_by_hand():
    # L_max = 20, L_cache = 4: free up to 16, linear to -1 at 20, -1 beyond
    lengths = torch.tensor([0, 16, 17, 18, 20, 25])
    pen = soft_overlong_penalty(lengths, max_tokens=20, buffer=4)
    assert pen.tolist() == pytest.approx([0.0, 0.0, -0.25, -0.5, -1.0, -1.0])
    assert soft_overlong_penalty(lengths, 20, 4, factor=0.5).tolist() == pytest.approx(
        [0.0, 0.0, -0.125, -0.25, -0.5, -0.5])


def test_soft_overlong_penalty_off_and_bad_buffer():
    assert soft_overlong_penalty(torch.tensor([100]), 20, 0).tolist() == [0.0]
    with pytest.raises(ValueError, match="must not exceed"):
        soft_overlong_penalty(torch.tensor([1]), 20, 30)


def test_overlong_filter_and_signal():
    assert overlong_keep_mask(["stop", "length", "stop"]) == [True, False, True]
    assert not has_signal([1.0, 1.0, 1.0])
    assert has_signal([0.0, 0.0, 1.0])
