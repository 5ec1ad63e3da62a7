"""An episode cut into several training sequences (AgentEnv chains: its calls did not extend one another) weighs
in the loss what it would weigh as one sequence, under every aggregation; its group's advantage statistics count
it once; and the trainer hands the loss each piece's episode size."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.algos.aggregation import AGGREGATIONS, aggregate
from posttrain.loop.batch import BatchOptions, build_batch, sequences_from_groups
from posttrain.types import Group, Sequence, Trajectory, Turn


def _turn(prompt, n, start=10):
    return Turn(list(prompt), list(range(start, start + n)), [-0.5] * n, 0)


def _whole(lengths, reward):
    """One episode whose calls extend one another: one sequence."""
    turns, ctx = [], [1, 2, 3]
    for i, n in enumerate(lengths):
        t = _turn(ctx, n, start=10 + 6 * i)
        turns.append(t)
        ctx = ctx + t.completion_ids + [7]  # the env's tokens between calls
    return Trajectory(turns=turns, reward=reward)


def _split(lengths, reward):
    """The same calls, each starting a fresh conversation: one chain per call."""
    chains = [[_turn([1, 2, 3, 50 + i], n, start=10 + 6 * i)] for i, n in enumerate(lengths)]
    return Trajectory(turns=chains[-1], extra_chains=chains[:-1], reward=reward)


def _token_weights(seqs: list[Sequence], total_seqs: float, mode: str, max_tokens: int = 64) -> list[float]:
    """d loss / d l_t for every loss token, in sequence order: what each token weighs in the loss."""
    from posttrain.training.batching import episode_tokens_B

    T = max(len(s.completion_ids) for s in seqs)
    mask = torch.zeros(len(seqs), T)
    for i, s in enumerate(seqs):
        mask[i, : len(s.loss_mask)] = torch.tensor(s.loss_mask, dtype=torch.float32)
    loss = torch.ones(len(seqs), T, requires_grad=True)
    total_tokens = float(mask.sum())
    aggregate(loss, mask, mode, total_tokens, total_seqs, max_tokens, episode_tokens_B(seqs)).backward()
    assert loss.grad is not None
    return [float(w) for i in range(len(seqs)) for w, m in zip(loss.grad[i], mask[i]) if m > 0]


def _batch_weights(trajs: list[Trajectory], mode: str) -> list[float]:
    batch, _ = build_batch(sequences_from_groups([Group(0, trajs)]), BatchOptions(keep_zero_advantage=True))
    assert batch.total_seqs is not None
    return _token_weights(batch.sequences, batch.total_seqs, mode)


@pytest.mark.parametrize("mode", sorted(AGGREGATIONS.names()))
def test_a_split_episode_weighs_what_the_whole_one_weighs(mode):
    other = _whole([4], 0.0)
    whole = _batch_weights([_whole([2, 3, 5], 1.0), other], mode)
    split = _batch_weights([_split([2, 3, 5], 1.0), other], mode)
    # Token for token (the split episode's tokens come in another order: compare the multisets) and in total.
    assert sorted(split) == pytest.approx(sorted(whole))
    assert sum(split[:10]) == pytest.approx(sum(whole[:10]))


def test_seq_mean_weighs_a_split_episode_as_one_sequence():
    """seq-mean-token-mean: the two episodes weigh 1/2 each, however many pieces the first one became (counted
    per piece it would weigh 3/4, each piece 1/4)."""
    w = _batch_weights([_split([2, 3, 5], 1.0), _whole([4], 0.0)], "seq-mean-token-mean")
    assert sum(w[:10]) == pytest.approx(0.5) and sum(w[10:]) == pytest.approx(0.5)


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 6), min_size=1, max_size=5),
    others=st.lists(st.integers(0, 6), min_size=1, max_size=3),
    mode=st.sampled_from(["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]),
)
def test_split_invariance_holds_for_any_cut(lengths, others, mode):
    if sum(lengths) + sum(others) == 0:
        return
    rest = [_whole([n], 0.0) for n in others]
    whole = _batch_weights([_whole(lengths, 1.0), *rest], mode)
    split = _batch_weights([_split(lengths, 1.0), *rest], mode)
    assert sorted(split) == pytest.approx(sorted(whole))


def test_kl_as_reward_charges_an_episode_the_sum_of_its_pieces():
    """The KL penalty is a sum over tokens: an episode pays it once, for all its pieces' tokens."""
    from dataclasses import replace

    from posttrain.loop.shaping import shaped_sequences

    trajs = [_split([2, 3], 1.0), _whole([2, 3], 1.0)]
    seqs = sequences_from_groups([Group(0, trajs)])
    seqs = [replace(s, ref_logprobs=[x - 0.1 for x in s.sampler_logprobs]) for s in seqs]
    opts = BatchOptions(kl_reward_beta=1.0, kl_estimator="k1", keep_zero_advantage=True)
    batch, _ = build_batch(shaped_sequences(seqs, opts)[0], opts)
    rewards = {s.episode: s.reward for s in batch.sequences}
    assert len(batch.sequences) == 3 and len(set(rewards.values())) == 1  # same tokens, same penalty
    assert {s.advantage for s in batch.sequences} == {0.0}


def test_the_trainer_hands_the_loss_each_piece_s_episode_size(tiny):
    from posttrain.algos.losses import LossInputs
    from posttrain.training.batching import group_sequences
    from posttrain.training.trainer import Trainer
    from posttrain.types import Batch

    model, _ = tiny
    trajs = [_split([2, 3], 1.0), _whole([4], 0.0)]
    batch, _ = build_batch(sequences_from_groups([Group(0, trajs)]), BatchOptions())
    seen: list[LossInputs] = []

    def loss_fn(logp_BT, old_BT, ref_BT, adv_B, mask_BT, params, inputs):
        seen.append(inputs)
        return (logp_BT * mask_BT).sum() * 0.0, {}

    # Prefix sharing computes one prompt per (group, prompt): the pieces' prompts differ, so each is a slice.
    assert sorted(len(g.sequences) for g in group_sequences(batch)) == [1, 1, 1]
    Trainer(model, pad_id=0, micro_batch_tokens=10_000).forward_backward(batch, loss_fn, None)  # type: ignore[arg-type]
    sizes = sorted(float(x) for i in seen if i.seq_tokens_B is not None for x in i.seq_tokens_B)
    assert sizes == [0.0, 5.0, 5.0]  # the whole episode: 0, its own count
    assert all(i.total_seqs == 2 for i in seen)
    assert isinstance(batch, Batch)
