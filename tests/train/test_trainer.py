import math
from dataclasses import replace

import pytest
import torch
from batches import random_batch as _batch

from posttrain.algos import LOSSES, LossParams
from posttrain.training import Trainer
from posttrain.training.batching import group_sequences, micro_batch_cost, plan_micro_batches
from posttrain.training.logprobs import completion_logprobs
from posttrain.types import Batch


def _grads(model):
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def test_prefix_sharing_equals_full_forward(tiny):
    model, tok = tiny
    batch = _batch(len(tok))
    groups = [g for mb in plan_micro_batches(batch, 10**9) for g in mb]
    out = {}
    for shared in (True, False):
        model.zero_grad()
        t = completion_logprobs(model, groups, tok.pad_token_id, shared=shared)
        (t.logp_BT * t.mask_BT).sum().backward()
        out[shared] = (t.logp_BT.detach(), _grads(model))
    assert (out[True][0] - out[False][0]).abs().max() < 1e-5
    assert torch.allclose(out[True][1], out[False][1], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("chunk", [1, 7, 10**6])
def test_chunked_output_projection_equals_full_logits(tiny, shared, chunk):
    """Log-probs, entropies and gradients through the chunked head (never B x T x V logits) match the full path."""
    model, tok = tiny
    batch = _batch(len(tok))
    groups = [g for mb in plan_micro_batches(batch, 10**9) for g in mb]
    out = {}
    for c in (0, chunk):
        model.zero_grad()
        t = completion_logprobs(model, groups, tok.pad_token_id, temperature=0.7, shared=shared, with_entropy=True,
                                chunk_tokens=c)
        (t.logp_BT * t.mask_BT).sum().backward()
        out[c] = (t.logp_BT.detach(), t.entropy_BT, _grads(model))
    assert torch.allclose(out[0][0], out[chunk][0], atol=1e-6)
    assert torch.allclose(out[0][1] * out[0][0].ne(0), out[chunk][1] * out[0][0].ne(0), atol=1e-5)
    assert (out[0][2] - out[chunk][2]).abs().max() < 1e-4 * out[0][2].abs().max(), (out[0][2] - out[chunk][2]).abs().max()


def test_chunked_trainer_gradient_equals_the_full_one(tiny):
    import copy

    model, tok = tiny
    batch = _batch(len(tok), n_groups=3, seed=2)
    grads, metrics = [], []
    for chunk in (0, 16):
        tr = Trainer(copy.deepcopy(model), pad_id=tok.pad_token_id, lr=1e-2, logits_chunk_tokens=chunk)
        metrics.append(tr.forward_backward(batch, LOSSES["ppo_clip"], LossParams()).metrics)
        grads.append(_grads(tr.model))
    # (Compared before the optimizer: Adam divides by sqrt(v), which turns 1e-9 differences in near-zero
    # gradients into visible ones.)
    assert (grads[0] - grads[1]).abs().max() < 1e-4 * grads[0].abs().max()
    assert metrics[1]["train/loss"] == pytest.approx(metrics[0]["train/loss"], abs=1e-6)
    assert metrics[1]["train/entropy"] == pytest.approx(metrics[0]["train/entropy"], rel=1e-5)


def test_micro_batches_respect_budget_and_keep_groups_whole():
    batch = _batch(50, n_groups=5, g=4)
    assert max(micro_batch_cost([g]) for g in group_sequences(batch)) <= 60  # every group fits: none is split
    plans = plan_micro_batches(batch, max_tokens=60)
    assert len(plans) > 1
    seen = [s for mb in plans for g in mb for s in g.sequences]
    assert sorted(map(id, seen)) == sorted(map(id, batch.sequences))
    for mb in plans:
        for g in mb:
            assert len({s.group_id for s in g.sequences}) == 1


def test_a_group_over_the_budget_is_split_and_the_gradient_does_not_change(tiny):
    """Multi-turn groups (4 episodes of thousands of tokens) used to form one micro-batch whatever the budget:
    memory grew with the episodes until a run was OOM-killed. They are split now, with the same gradient."""
    model, tok = tiny
    batch = _batch(len(tok), n_groups=2, g=4)
    one_group = max(micro_batch_cost([g]) for g in group_sequences(batch))
    budget = one_group // 2
    plans = plan_micro_batches(batch, max_tokens=budget)
    assert all(micro_batch_cost(mb) <= budget or sum(len(g.sequences) for g in mb) == 1 for mb in plans)
    seen = sorted(i for mb in plans for g in mb for i in g.indices)
    assert seen == list(range(len(batch.sequences)))  # every sequence once
    for mb in plans:
        for g in mb:
            assert all(batch.sequences[i] is s for i, s in zip(g.indices, g.sequences))
    grads = []
    for b in (10**9, budget, 1):  # whole groups; halves; one sequence per micro-batch
        tr = Trainer(model, pad_id=tok.pad_token_id, micro_batch_tokens=b)
        model.zero_grad()
        m = tr.forward_backward(batch, LOSSES["ppo_clip"], LossParams()).metrics
        grads.append((_grads(model).clone(), m["train/loss"]))
    for g, loss in grads[1:]:
        assert torch.allclose(grads[0][0], g, atol=1e-6, rtol=1e-4)
        assert loss == pytest.approx(grads[0][1], abs=1e-6)


def test_gradient_accumulation_matches_one_big_batch(tiny):
    model, tok = tiny
    batch = _batch(len(tok), n_groups=4)
    grads = []
    for budget in (10**9, 40):  # one micro-batch vs several
        tr = Trainer(model, pad_id=tok.pad_token_id, micro_batch_tokens=budget)
        model.zero_grad()
        tr.forward_backward(batch, LOSSES["ppo_clip"], LossParams())
        grads.append(_grads(model).clone())
    assert torch.allclose(grads[0], grads[1], atol=1e-6, rtol=1e-4)


def test_step_changes_weights_and_logs_mismatch(tiny):
    model, tok = tiny
    tr = Trainer(model, pad_id=tok.pad_token_id, lr=1e-2)
    before = [p.detach().clone() for p in model.parameters()]
    m = tr.forward_backward(_batch(len(tok)), LOSSES["ppo_clip"], LossParams()).metrics
    m.update(tr.optim_step())
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    for k in ("train/loss", "train/grad_norm", "train/entropy", "train/sampler_logp_abs_diff", "train/clipfrac_high"):
        assert math.isfinite(m[k])
    assert m["train/skipped_step"] == 0.0


def test_non_finite_loss_skips_step(tiny):
    model, tok = tiny
    tr = Trainer(model, pad_id=tok.pad_token_id, lr=1e-2)
    before = [p.detach().clone() for p in model.parameters()]

    def nan_loss(logp, old, ref, adv, mask, cfg, inputs):
        return (logp * float("nan")).sum(), {}

    tr.forward_backward(_batch(len(tok)), nan_loss, LossParams())
    m = tr.optim_step()
    assert m["train/skipped_step"] == 1.0 and tr.skipped_steps == 1
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_save_and_load_state_roundtrip(tiny, tmp_path):
    model, tok = tiny
    tr = Trainer(model, pad_id=tok.pad_token_id, lr=1e-2)
    tr.forward_backward(_batch(len(tok)), LOSSES["ppo_clip"], LossParams())
    tr.optim_step()
    tr.save_state(str(tmp_path / "s.pt"))
    saved = {n: p.detach().clone() for n, p in model.named_parameters()}
    tr.forward_backward(_batch(len(tok), seed=1), LOSSES["ppo_clip"], LossParams())
    tr.optim_step()
    tr.load_state(str(tmp_path / "s.pt"))
    assert all(torch.equal(saved[n], p) for n, p in model.named_parameters())
    assert tr.step == 1


def test_model_without_trainable_params_is_an_error(tiny):
    model, tok = tiny
    model.requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        Trainer(model, pad_id=0)


def test_leaving_out_zero_advantage_sequences_gives_the_same_gradient(tiny):
    model, tok = tiny
    batch = _batch(len(tok), n_groups=4)
    batch.sequences = [replace(s, advantage=0.0) for s in batch.sequences[:5]] + batch.sequences[5:]
    tr = Trainer(model, pad_id=tok.pad_token_id)
    model.zero_grad()
    tr.forward_backward(batch, LOSSES["ppo_clip"], LossParams())
    full = _grads(model).clone()
    part = Batch([s for s in batch.sequences if s.advantage != 0.0], total_loss_tokens=float(batch.num_loss_tokens),
                 total_seqs=float(len(batch.sequences)))
    model.zero_grad()
    tr.forward_backward(part, LOSSES["ppo_clip"], LossParams())
    assert torch.allclose(full, _grads(model), atol=1e-7, rtol=1e-5)
