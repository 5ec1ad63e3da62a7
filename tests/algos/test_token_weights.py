import pytest
import torch

from posttrain.algos import LOSSES, LossInputs, LossParams
from posttrain.algos.token_weights import TOKEN_WEIGHTS


def test_high_entropy_keeps_top_fraction_of_loss_tokens():
    ent = torch.tensor([[0.1, 0.9, 0.5, 0.2, 9.0], [0.8, 0.3, 0.7, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]])  # 9.0 is padding: never chosen
    w = TOKEN_WEIGHTS["high_entropy"](ent, mask, frac=3 / 7)
    assert w.tolist() == [[0, 1, 0, 0, 0], [1, 0, 1, 0, 0]]
    assert TOKEN_WEIGHTS["none"](ent, mask).tolist() == mask.float().tolist()
    with pytest.raises(ValueError):
        TOKEN_WEIGHTS["high_entropy"](ent, mask, frac=0.0)


def test_zero_weight_tokens_get_no_gradient_in_every_loss():
    torch.manual_seed(0)
    mask = torch.ones(2, 4)
    w = torch.tensor([[1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, 1.0]])
    for name in ("ppo_clip", "reinforce", "cispo"):
        logp = torch.randn(2, 4, requires_grad=True)
        loss, _ = LOSSES[name](logp, logp.detach(), None, torch.tensor([1.0, -0.5]), mask,
                               LossParams(), LossInputs(token_weights_BT=w))
        loss.backward()
        assert torch.all(logp.grad[w == 0] == 0), name
        assert torch.all(logp.grad[w == 1] != 0), name
