"""Activation checkpointing (trainer.gradient_checkpointing): same log-probs and gradients, far fewer saved bytes."""

import copy

import pytest
import torch

from posttrain.algos import LOSSES, LossParams
from posttrain.training import Trainer
from posttrain.training.batching import plan_micro_batches
from posttrain.training.checkpointing import checkpoint_layers
from posttrain.training.logprobs import completion_logprobs

from batches import random_batch as _batch


def _grads(model):
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def _run(model, groups, pad_id, shared, chunk=0):
    """Log-probs, entropies and gradients of one pass, and the bytes autograd saved for backward during it."""
    model.zero_grad()
    saved = [0]

    def pack(t):
        saved[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        t = completion_logprobs(model, groups, pad_id, temperature=0.7, shared=shared, with_entropy=True,
                                chunk_tokens=chunk)
    (t.logp_BT * t.mask_BT).sum().backward()
    return t.logp_BT.detach(), t.entropy_BT, _grads(model), saved[0]


@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("chunk", [0, 16])
def test_checkpointed_layers_give_the_same_logprobs_and_gradients(tiny, shared, chunk):
    model, tok = tiny
    model = copy.deepcopy(model).train()
    groups = [g for mb in plan_micro_batches(_batch(len(tok), n_groups=3, seed=1), 10**9) for g in mb]
    plain = _run(model, groups, tok.pad_token_id, shared, chunk)
    assert checkpoint_layers(model) == model.config.num_hidden_layers
    ckpt = _run(model, groups, tok.pad_token_id, shared, chunk)
    assert torch.allclose(plain[0], ckpt[0], atol=1e-6)
    mask = plain[0].ne(0)
    assert torch.allclose(plain[1] * mask, ckpt[1] * mask, atol=1e-6)
    # A prompt cache appended twice on replay would change shapes (an error) or values (these gradients).
    assert (plain[2] - ckpt[2]).abs().max() <= 1e-5 * plain[2].abs().max()
    # The point of it: what is kept for backward shrinks (the layers' insides are recomputed, not stored).
    assert ckpt[3] < 0.5 * plain[3], (ckpt[3], plain[3])
    checkpoint_layers(model, enabled=False)
    again = _run(model, groups, tok.pad_token_id, shared, chunk)
    assert again[3] == plain[3]


def test_trainer_with_checkpointing_takes_the_same_step(tiny):
    model, tok = tiny
    batch = _batch(len(tok), n_groups=3, seed=2)
    grads, metrics = [], []
    for ckpt in (False, True):
        tr = Trainer(copy.deepcopy(model), pad_id=tok.pad_token_id, lr=1e-2, gradient_checkpointing=ckpt)
        metrics.append(tr.forward_backward(batch, LOSSES["ppo_clip"], LossParams()).metrics)
        grads.append(_grads(tr.model))
    assert (grads[0] - grads[1]).abs().max() <= 1e-5 * grads[0].abs().max()
    assert metrics[1]["train/loss"] == pytest.approx(metrics[0]["train/loss"], abs=1e-6)


def test_checkpointing_a_model_without_decoder_layers_is_a_clear_error():
    with pytest.raises(ValueError, match="gradient_checkpointing"):
        checkpoint_layers(torch.nn.Sequential(torch.nn.Linear(2, 2)))


def test_both_prefix_sharing_passes_are_checkpointed(tiny, monkeypatch):
    """The prompt pass and the completion pass each re-run every layer in backward (a cache that is not replay-safe
    would make the guard skip checkpointing silently)."""
    import posttrain.training.checkpointing as ck

    model, tok = tiny
    model = copy.deepcopy(model).train()
    checkpoint_layers(model)
    calls = []
    real = ck.checkpoint
    monkeypatch.setattr(ck, "checkpoint", lambda *a, **k: calls.append(1) or real(*a, **k))
    groups = [g for mb in plan_micro_batches(_batch(len(tok), n_groups=2, seed=3), 10**9) for g in mb]
    _run(model, groups, tok.pad_token_id, shared=True)
    assert len(calls) == 2 * model.config.num_hidden_layers


def test_a_growing_cache_under_checkpointing_runs_unchecked_and_stays_correct(tiny):
    """A plain model call in train mode (transformers makes its own DynamicCache, which would grow on replay) gives
    the same gradients with the layers switched to checkpointing."""
    model, tok = tiny
    model = copy.deepcopy(model).train()
    ids = torch.randint(3, len(tok), (2, 9))
    grads = []
    for on in (False, True):
        checkpoint_layers(model, enabled=on)
        model.zero_grad()
        model(input_ids=ids, use_cache=True).logits.float().logsumexp(-1).sum().backward()
        grads.append(_grads(model))
    assert torch.allclose(grads[0], grads[1], atol=1e-6)


def test_checkpointing_with_lora_gives_the_same_adapter_gradients(tiny):
    from posttrain.models.lora import apply_lora

    model, tok = tiny
    groups = [g for mb in plan_micro_batches(_batch(len(tok), n_groups=2, seed=4), 10**9) for g in mb]
    out = []
    for on in (False, True):
        torch.manual_seed(0)  # the adapters' random init, the same both times
        m = apply_lora(copy.deepcopy(model), r=4, alpha=8.0, dropout=0.0, target_modules=["q_proj", "v_proj"]).train()
        for n, p in m.named_parameters():  # B starts at zero; give it values so A's gradient is not zero
            if "lora_B" in n:
                torch.nn.init.normal_(p, std=0.02)
        checkpoint_layers(m, enabled=on)
        out.append(_run(m, groups, tok.pad_token_id, shared=True))
    assert torch.allclose(out[0][0], out[1][0], atol=1e-6)
    assert (out[0][2] - out[1][2]).abs().max() <= 1e-5 * out[0][2].abs().max()
    assert out[1][3] < 0.5 * out[0][3]
