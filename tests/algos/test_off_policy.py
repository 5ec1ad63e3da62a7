import math

import pytest
import torch

from posttrain.algos import mask_by_ratio, tis_weights


def _pair():
    logp = torch.tensor([[-1.0, -0.2, -3.0, 0.0], [-0.5, -0.5, -0.5, -0.5]], requires_grad=True)
    sampler = torch.tensor([[-1.0, -1.5, -2.0, -9.0], [-0.6, -0.4, -0.5, -0.5]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])  # last token of row 0 is padding (huge ratio: ignored)
    return logp, sampler, mask


def test_token_tis_caps_and_detaches():
    logp, sampler, mask = _pair()
    w, m = tis_weights(logp, sampler, mask, cap=2.0, level="token")
    assert not w.requires_grad
    r = torch.exp(logp.detach() - sampler)
    assert torch.allclose(w, torch.minimum(r, torch.tensor(2.0)) * mask)
    assert (w <= 2.0).all() and w[0, 3] == 0.0
    assert w[0, 1].item() == pytest.approx(2.0)  # e^{1.3} ~ 3.67 capped
    assert m["is_capped_frac"] == pytest.approx(1 / 7)
    assert m["is_ratio_max"] == pytest.approx(math.exp(1.3), rel=1e-5)
    assert m["is_ratio_mean"] == pytest.approx(float((r * mask).sum() / 7), rel=1e-5)


def test_sequence_tis_is_constant_along_a_sequence():
    logp, sampler, mask = _pair()
    w, m = tis_weights(logp, sampler, mask, cap=2.0, level="sequence")
    # row 0: log r = 0 + 1.3 - 1.0 = 0.3 ; row 1: 0.1 - 0.1 + 0 + 0 = 0
    assert torch.allclose(w[0, :3], torch.full((3,), math.exp(0.3)))
    assert torch.allclose(w[1], torch.ones(4))
    assert w[0, 3] == 0.0
    assert m["is_capped_frac"] == 0.0
    w_capped, m = tis_weights(logp, sampler, mask, cap=1.2, level="sequence")
    assert (w_capped <= 1.2 + 1e-6).all() and w_capped[0, 0].item() == pytest.approx(1.2)
    assert m["is_capped_frac"] == pytest.approx(0.5)


def test_tis_huge_ratio_stays_finite():
    logp = torch.zeros(1, 200)
    w, m = tis_weights(logp, torch.full((1, 200), -5.0), torch.ones(1, 200), cap=3.0, level="sequence")
    assert torch.allclose(w, torch.full((1, 200), 3.0))
    assert m["is_capped_frac"] == 1.0


def test_mask_by_ratio_drops_tokens_and_sequences():
    logp, sampler, mask = _pair()
    keep, m = mask_by_ratio(logp, sampler, mask, threshold=2.0, level="token")
    # token log-ratios: row 0 [0, 1.3, -1.0, pad], row 1 [0.1, -0.1, 0, 0]; log 2 ~ 0.693
    assert keep.tolist() == [[1, 0, 0, 0], [1, 1, 1, 1]]  # 1.3 > log 2 and -1.0 < -log 2
    assert keep.dtype == mask.dtype
    assert m["is_masked_frac"] == pytest.approx(2 / 7)
    keep, m = mask_by_ratio(logp, sampler, mask, threshold=1.2, level="sequence")  # log 1.2 ~ 0.18 < 0.3
    assert keep.tolist() == [[0, 0, 0, 0], [1, 1, 1, 1]]
    assert m["is_masked_frac"] == pytest.approx(0.5)
    # Bounds are [1/threshold, threshold] inclusive.
    lr = torch.tensor([[-0.7, -0.69, 0.69, 0.7]])
    keep, _ = mask_by_ratio(lr, torch.zeros(1, 4), torch.ones(1, 4), threshold=2.0)
    assert keep.tolist() == [[0.0, 1.0, 1.0, 0.0]]
    with pytest.raises(ValueError):
        mask_by_ratio(logp, sampler, mask, threshold=0.5)
    with pytest.raises(KeyError):
        tis_weights(logp, sampler, mask, level="nope")


def test_sampler_kl_k3_metric():
    logp, sampler, mask = _pair()
    _, m = tis_weights(logp, sampler, mask)
    lr = (logp.detach() - sampler) * mask
    assert m["sampler_kl_k3"] == pytest.approx(float(((torch.exp(lr) - 1 - lr) * mask).sum() / 7), rel=1e-5)
    assert m["sampler_kl_k3"] > 0.01  # the pair differs: the estimate must see it
    _, m0 = tis_weights(sampler, sampler, mask)
    assert m0["sampler_kl_k3"] == 0.0 and m0["is_ratio_mean"] == 1.0
