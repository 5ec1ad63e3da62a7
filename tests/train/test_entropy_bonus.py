"""The entropy-bonus remedy: a loss term (algos/loss_terms.py) adds coef x mean(logp.detach() * logp) over the sampled
tokens, whose expected gradient is minus the entropy's (score function), so descending the loss raises the policy's
entropy. The trainer only hands the term its coefficient: with a plain policy loss nothing is added."""

import torch

from posttrain.algos import LOSSES, LossParams
from posttrain.algos.loss_terms import with_terms
from posttrain.training.protocol import StepSettings
from posttrain.training.trainer import Trainer
from posttrain.types import Batch, Sequence


def test_the_surrogate_has_minus_the_entropy_gradient_in_expectation():
    torch.manual_seed(0)
    theta = torch.randn(7, requires_grad=True)
    logp = torch.log_softmax(theta, -1)
    entropy = -(logp.exp() * logp).sum()
    (g_entropy,) = torch.autograd.grad(entropy, theta, retain_graph=True)
    # E_{y ~ pi}[logp(y).detach() * logp(y)], the expectation written out over the 7 outcomes
    surrogate = (logp.exp().detach() * logp.detach() * logp).sum()
    (g_surrogate,) = torch.autograd.grad(surrogate, theta)
    assert torch.allclose(g_surrogate, -g_entropy, atol=1e-6)


def _grads(trainer, batch, loss=None, coef=0.0):
    trainer.model.zero_grad(set_to_none=True)
    loss = loss or with_terms(LOSSES["ppo_clip"])
    m = trainer.forward_backward(batch, loss, LossParams(), settings=StepSettings(entropy_coef=coef)).metrics
    return torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None]), m


def test_the_trainer_adds_the_bonus_only_when_asked(tiny):
    model, tok = tiny
    trainer = Trainer(model, pad_id=tok.pad_token_id)
    ids = tok("hello there world", add_special_tokens=False)["input_ids"]
    seq = Sequence(ids[:2], ids[2:], [1] * len(ids[2:]), [-1.0] * len(ids[2:]), advantage=1.0)
    g0, m0 = _grads(trainer, Batch([seq]))
    g1, m1 = _grads(trainer, Batch([seq]), coef=0.5)
    assert "train/entropy_bonus" not in m0 and m1["train/entropy_bonus"] == 0.5
    assert not torch.allclose(g0, g1)
    g2, _ = _grads(trainer, Batch([seq]), coef=0.0)
    assert torch.allclose(g0, g2)


def test_the_trainer_adds_nothing_to_the_loss_it_is_handed(tiny):
    """The bonus is the composed loss's, not the trainer's: a plain policy loss under the same setting is unchanged."""
    model, tok = tiny
    trainer = Trainer(model, pad_id=tok.pad_token_id)
    ids = tok("hello there world", add_special_tokens=False)["input_ids"]
    seq = Sequence(ids[:2], ids[2:], [1] * len(ids[2:]), [-1.0] * len(ids[2:]), advantage=1.0)
    g0, _ = _grads(trainer, Batch([seq]), LOSSES["ppo_clip"])
    g1, m1 = _grads(trainer, Batch([seq]), LOSSES["ppo_clip"], coef=0.5)
    assert "train/entropy_bonus" not in m1 and torch.equal(g0, g1)
