"""build_batch: failed samples, zero-variance groups, overlong filter and penalty, KL as reward, normalizers,
and the token weights the trainer applies to a built batch."""

import math
from dataclasses import replace

import pytest
import torch

from posttrain.algos import ADVANTAGES, LOSSES, LossParams
from posttrain.loop.batch import BatchOptions, build_batch, sequences_from_groups
from posttrain.loop.shaping import apply_overlong_penalty, shaped_sequences
from posttrain.training.trainer import Trainer
from posttrain.types import Batch, Group, Trajectory, Turn


def _traj(reward, n=4, finish="stop", failed=False, prompt=(1, 2, 3)):
    return Trajectory(
        turns=[Turn(list(prompt), list(range(10, 10 + n)), [-0.5] * n, 0, finish)], reward=reward, failed=failed)


def _groups(*reward_lists, **kw):
    return [Group(i, [_traj(r, prompt=(1, 2, 3 + i), **kw) for r in rs]) for i, rs in enumerate(reward_lists)]


def test_failed_samples_are_left_out_of_advantages_and_batch():
    groups = _groups([1.0, 0.0, 5.0])
    # its reward (5.0) must not move the baseline
    groups[0].trajectories_G[2] = replace(groups[0].trajectories_G[2], failed=True)
    seqs = sequences_from_groups(groups)
    assert len(seqs) == 2
    batch, m = build_batch(seqs, BatchOptions())
    assert [s.advantage for s in batch.sequences] == pytest.approx([0.5 / math.sqrt(0.5), -0.5 / math.sqrt(0.5)], rel=1e-4)
    assert batch.total_seqs == 2.0 and batch.total_loss_tokens == 8.0


def test_zero_variance_group_contributes_nothing_but_counts_in_normalizers():
    seqs = sequences_from_groups(_groups([1.0, 1.0], [1.0, 0.0]))
    batch, m = build_batch(seqs, BatchOptions())
    assert [s.group_id for s in batch.sequences] == [1, 1]  # group 0 has no signal: no forward needed
    assert m["train/zero_adv_seqs_skipped"] == 2.0
    assert batch.total_seqs == 4.0 and batch.total_loss_tokens == 16.0  # ...but it still counts
    kept, _ = build_batch(seqs, BatchOptions(keep_zero_advantage=True))  # a KL term in the loss: all trained
    assert len(kept.sequences) == 4


def test_overlong_filter_zeroes_the_mask_of_truncated_samples_only():
    groups = _groups([1.0, 0.0, 0.2])
    groups[0].trajectories_G[1].turns[0].finish_reason = "length"
    seqs = sequences_from_groups(groups)
    opts = BatchOptions(overlong_filter=True)
    shaped, m = shaped_sequences(seqs, opts)
    batch, _ = build_batch(shaped, opts)
    assert m["dapo/overlong_filtered"] == 1.0
    assert [s.finish_reason for s in batch.sequences] == ["stop", "stop"]  # no loss tokens left: not trained
    assert batch.total_loss_tokens == 8.0 and batch.total_seqs == 3.0  # still counted as a sequence
    assert seqs[1].loss_mask == [1] * 4  # pure: the input sequences are untouched


def test_overlong_penalty_is_shaped_into_rewards_before_advantages():
    groups = [Group(0, [_traj(1.0, n=2), _traj(1.0, n=10)])]
    shaped, mean = apply_overlong_penalty(groups, buffer_frac=0.5, penalty=1.0, max_tokens=10)
    assert [t.reward for t in groups[0].trajectories_G] == [1.0, 1.0]  # pure: new trajectories, these as they were
    groups = shaped
    short, long_ = groups[0].trajectories_G
    assert short.reward == 1.0 and long_.reward == pytest.approx(0.0)  # at the limit: the full penalty
    assert long_.reward_components["overlong_penalty"] == pytest.approx(-1.0)
    assert mean == pytest.approx(-0.5)
    batch, _ = build_batch(sequences_from_groups(groups), BatchOptions())
    assert batch.sequences[0].advantage > 0 > batch.sequences[1].advantage  # equal rewards no longer


def test_kl_as_reward_penalises_by_the_reference_and_needs_ref_logprobs():
    seqs = sequences_from_groups(_groups([1.0, 1.0]))
    seqs = [replace(s, ref_logprobs=[ref] * 4) for s, ref in zip(seqs, (-0.5, -2.5))]
    opts = BatchOptions(kl_reward_beta=0.1, kl_estimator="k1")
    shaped, m = shaped_sequences(seqs, opts)
    batch, _ = build_batch(shaped, opts)
    # k1 = logp - ref per token, summed: 0 for the first, 4 * 2.0 for the second -> penalties 0 and 0.8
    assert m["kl/reward_penalty_mean"] == pytest.approx(0.4)
    assert [s.reward for s in batch.sequences] == pytest.approx([1.0, 0.2])
    assert batch.sequences[0].advantage > 0 > batch.sequences[1].advantage
    assert [s.reward for s in seqs] == [1.0, 1.0]  # pure: the input sequences are untouched
    kept_all = replace(opts, keep_zero_advantage=True)
    assert [s.reward for s in build_batch(seqs, kept_all)[0].sequences] == [1.0, 1.0], "build_batch only reads rewards"
    seqs = [replace(s, ref_logprobs=None) for s in seqs]
    with pytest.raises(ValueError, match="ref_logprobs"):
        shaped_sequences(seqs, BatchOptions(kl_reward_beta=0.1))


@pytest.mark.parametrize("name", ADVANTAGES.names())
def test_every_advantage_estimator_is_used_by_name(name):
    seqs = sequences_from_groups(_groups([1.0, 0.0, 0.5], [0.2, 0.9]))
    batch, m = build_batch(seqs, BatchOptions(advantage=name, keep_zero_advantage=True))
    rewards = torch.tensor([s.reward for s in seqs])
    want = ADVANTAGES[name](rewards, torch.tensor([s.group_id for s in seqs]), scale_std=True)
    assert [s.advantage for s in batch.sequences] == pytest.approx(want.tolist())


def test_empty_and_all_failed_inputs_give_an_empty_batch():
    batch, m = build_batch([], BatchOptions())
    assert batch.sequences == [] and m["adv/mean"] == 0.0
    assert sequences_from_groups(_groups([1.0, 0.0], failed=True)) == []


def test_the_trained_part_gives_the_full_batch_gradient(tiny):
    """The normalizers the batch carries make training on the non-zero part exactly the full update."""
    model, tok = tiny
    groups = [Group(i, [_traj(r, n=3 + j, prompt=(5, 6, 7 + i)) for j, r in enumerate(rs)])
              for i, rs in enumerate(([1.0, 1.0, 1.0], [1.0, 0.0, 0.5]))]
    seqs = sequences_from_groups(groups)
    part, _ = build_batch(seqs, BatchOptions())
    full, _ = build_batch(seqs, BatchOptions(keep_zero_advantage=True))
    assert len(part.sequences) < len(full.sequences)
    grads = []
    for b in (full, Batch(part.sequences, total_loss_tokens=part.total_loss_tokens, total_seqs=part.total_seqs)):
        model.zero_grad()
        Trainer(model, pad_id=tok.pad_token_id).forward_backward(b, LOSSES["ppo_clip"], LossParams())
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    assert torch.allclose(grads[0], grads[1], atol=1e-7, rtol=1e-5)


def test_token_weights_for_a_built_batch_are_is_correction_times_credit():
    """Token weights are not a field of the batch: the trainer asks `token_weight_fn` per micro-batch (it needs
    the current policy's log-probs and entropies). Checked here on the shapes a built batch gives: neither option
    -> no weights; credit alone -> the credit mask; TIS alone -> the capped ratio; both -> their product, and
    padding always 0."""
    from posttrain.config.schema import AlgorithmConfig
    from posttrain.training.from_config import token_weight_fn

    batch, _ = build_batch(sequences_from_groups(_groups([0.0, 1.0], [1.0, 0.0])), BatchOptions())
    assert len(batch.sequences) == 4
    mask = torch.tensor([[1.0, 1, 1, 0], [1, 1, 1, 1]])
    logp = torch.tensor([[-0.1, -2.0, -0.3, 0.0], [-1.0, -1.0, -1.0, -1.0]])
    sampler = torch.tensor([[-1.5, -2.0, -0.3, 0.0], [-1.0, -1.0, -1.0, -1.0]])  # one token 4x likelier now
    # 7 loss tokens, frac 0.3 -> the top 3 by entropy (padding's 9.0 never counts)
    entropy = torch.tensor([[3.0, 0.1, 0.2, 9.0], [0.1, 0.2, 2.0, 0.3]])
    assert token_weight_fn(AlgorithmConfig()) is None
    credit, m = token_weight_fn(AlgorithmConfig(token_weighting="high_entropy", token_weighting_frac=0.3))(
        logp, sampler, entropy, mask)
    assert credit.tolist() == [[1, 0, 0, 0], [0, 0, 1, 1]] and "credit/weighted_token_frac" in m
    tis, m = token_weight_fn(AlgorithmConfig(is_correction="truncate", is_cap=2.0))(logp, sampler, entropy, mask)
    assert tis[0, 0].item() == pytest.approx(2.0) and tis[0, 1].item() == pytest.approx(1.0)
    assert tis[0, 3].item() == 0.0 and any(k.startswith("is/") for k in m)
    both, _ = token_weight_fn(AlgorithmConfig(is_correction="truncate", is_cap=2.0, token_weighting="high_entropy",
                                              token_weighting_frac=0.3))(logp, sampler, entropy, mask)
    assert torch.allclose(both, tis * credit)
