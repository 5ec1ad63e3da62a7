
from dataclasses import replace

import pytest
import torch
from batches import random_batch as _batch

from posttrain.algos import LOSSES, LossParams
from posttrain.training import Trainer
from posttrain.training.optimizers import build_optimizers, muon_param_split


def test_muon_gets_hidden_matrices_and_adamw_the_rest(tiny):
    model, _ = tiny
    named = list(model.named_parameters())
    muon, adamw = muon_param_split(named)
    assert muon and adamw
    assert all(p.ndim == 2 and "embed" not in n and "lm_head" not in n for n, p in muon)
    assert any(p.ndim == 1 for _, p in adamw)  # norms
    assert any("embed" in n for n, _ in adamw)
    opts = build_optimizers(named, "muon", 1e-3, (0.9, 0.99), 0.0)
    assert [type(o).__name__ for o in opts] == ["Muon", "AdamW"]
    muon_ids = {id(p) for g in opts[0].param_groups for p in g["params"]}
    adamw_ids = {id(p) for g in opts[1].param_groups for p in g["params"]}
    assert muon_ids == {id(p) for _, p in muon} and adamw_ids == {id(p) for _, p in adamw}
    assert not muon_ids & adamw_ids and len(muon_ids | adamw_ids) == len(named)
    with pytest.raises(KeyError, match="unknown optimizer .sgd."):
        build_optimizers(named, "sgd", 1e-3, (0.9, 0.99), 0.0)


def test_muon_trains_the_tiny_model_loss_goes_down(tiny):
    model, tok = tiny
    batch = _batch(len(tok), n_groups=2)
    batch.sequences = [replace(s, advantage=1.0) for s in batch.sequences]  # maximise the likelihood of these sequences: the loss must fall
    tr = Trainer(model, pad_id=tok.pad_token_id, lr=2e-2, optimizer="muon")
    losses = []
    for _ in range(8):
        m = tr.forward_backward(batch, LOSSES["reinforce"], LossParams()).metrics
        tr.optim_step()
        losses.append(m["train/loss"])
    assert losses[-1] < losses[0] - 0.5, losses


def test_muon_state_saves_and_loads(tiny, tmp_path):
    model, tok = tiny
    tr = Trainer(model, pad_id=tok.pad_token_id, lr=1e-3, optimizer="muon")
    tr.forward_backward(_batch(len(tok)), LOSSES["reinforce"], LossParams())
    tr.optim_step()
    tr.save_state(str(tmp_path / "s.pt"))
    tr2 = Trainer(model, pad_id=tok.pad_token_id, lr=1e-3, optimizer="muon")
    tr2.load_state(str(tmp_path / "s.pt"))
    assert tr2.step == 1
    adam_only = Trainer(model, pad_id=tok.pad_token_id, lr=1e-3)
    with pytest.raises(ValueError, match="optimizer states"):
        adam_only.load_state(str(tmp_path / "s.pt"))


def test_token_weight_fn_is_applied_per_micro_batch(tiny):
    model, tok = tiny
    batch = _batch(len(tok), n_groups=3)
    seen = []

    def zero_all(logp_BT, sampler_BT, ent_BT, mask_BT):
        seen.append(tuple(logp_BT.shape))
        return torch.zeros_like(logp_BT), {"w": 1.0}

    tr = Trainer(model, pad_id=tok.pad_token_id, micro_batch_tokens=40)
    model.zero_grad()
    m = tr.forward_backward(batch, LOSSES["ppo_clip"], LossParams(), token_weight_fn=zero_all).metrics
    assert len(seen) > 1 and m["train/w"] == 1.0
    assert all(p.grad is None or torch.count_nonzero(p.grad) == 0 for p in model.parameters())


def test_adamw_is_fused_on_plain_tensors_and_steps_like_the_multi_tensor_one():
    torch.manual_seed(0)
    ws = [torch.nn.Parameter(torch.randn(5, 3)) for _ in range(2)]
    twins = [torch.nn.Parameter(w.detach().clone()) for w in ws]
    fused = build_optimizers([(f"w{i}", w) for i, w in enumerate(ws)], "adamw", 1e-2, (0.9, 0.99), 0.1)[0]
    assert fused.defaults["fused"] is True
    ref = torch.optim.AdamW(twins, lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1, foreach=True)
    for _ in range(3):
        for a, b in zip(ws, twins):
            a.grad = b.grad = torch.randn(5, 3)
        fused.step()
        ref.step()
    for a, b in zip(ws, twins):
        assert torch.allclose(a, b, atol=1e-6)
    # A kind the fused kernel does not take (float64 here) falls back to the multi-tensor path.
    other = build_optimizers([("w", torch.nn.Parameter(torch.randn(2, dtype=torch.float64)))], "adamw", 1e-2,
                             (0.9, 0.99), 0.0)[0]
    assert not other.defaults.get("fused") and other.defaults["foreach"] is True
