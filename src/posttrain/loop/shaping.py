"""Reward shaping: pure functions from scored records to shaped ones (new groups, new sequences); the math is in
algos/dapo.py and algos/kl.py.

    apply_overlong_penalty(groups, ...) -> groups, mean   when a group is scored, before any group filter: dynamic
                                                          sampling keeps or drops a group by its shaped rewards
    shaped_sequences(seqs, options) -> seqs, metrics      right before build_batch: the DAPO overlong filter (a
                                                          truncated sequence gets no loss), then KL to the reference
                                                          as a reward (it needs the reference's log-probs)

build_batch (loop/batch.py) reads the rewards these leave and never works one out again.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from posttrain.algos.dapo import overlong_keep_mask, soft_overlong_penalty
from posttrain.algos.kl import kl_reward_penalty
from posttrain.envs.scoring import with_component
from posttrain.loop.batch import BatchOptions, episode_heads
from posttrain.types import Group, Sequence, Trajectory


def apply_overlong_penalty(
    groups: list[Group], buffer_frac: float, penalty: float, max_tokens: int
) -> tuple[list[Group], float]:
    """DAPO soft overlong punishment over the last `buffer_frac` of `max_tokens`: the groups with it added to each
    trajectory's reward (and recorded as its `overlong_penalty` component), and the mean penalty (0 when off).
    Pure: new groups of new trajectories, the given ones as they were."""
    buffer = round(buffer_frac * max_tokens)
    if buffer <= 0:
        return groups, 0.0
    trajs = [t for g in groups for t in g.trajectories_G]
    lengths = torch.tensor([t.num_completion_tokens for t in trajs])
    pen = soft_overlong_penalty(lengths, max_tokens, buffer, penalty)
    it = iter(pen.tolist())
    shaped = [Group(g.task_index, [_penalized(t, next(it)) for t in g.trajectories_G]) for g in groups]
    return shaped, float(pen.mean()) if len(trajs) else 0.0


def _penalized(t: Trajectory, p: float) -> Trajectory:
    return with_component(t, "overlong_penalty", p, p) if p != 0.0 else t


def shaped_sequences(seqs: list[Sequence], opts: BatchOptions) -> tuple[list[Sequence], dict[str, float]]:
    """The sequences as build_batch trains them, and the metrics: with `overlong_filter`, a truncated sequence's loss
    mask zeroed; with `kl_reward_beta`, each episode's reward less its KL penalty (the sum over its pieces: an episode
    pays for all its pieces' tokens; estimated over the loss mask, so a filtered sequence pays none). Pure."""
    m: dict[str, float] = {}
    if opts.overlong_filter:
        keep = overlong_keep_mask([s.finish_reason for s in seqs])
        seqs = [s if k else replace(s, loss_mask=[0] * len(s.loss_mask)) for s, k in zip(seqs, keep, strict=True)]
        m["dapo/overlong_filtered"] = float(sum(not k for k in keep))
    if opts.kl_reward_beta > 0 and seqs:
        heads, head_of = episode_heads(seqs)
        pen_E = [0.0] * len(heads)
        for e, p in zip(head_of, kl_penalties(seqs, opts.kl_reward_beta, opts.kl_estimator), strict=True):
            pen_E[e] += p
        rewards_E = [seqs[i].reward - p for i, p in zip(heads, pen_E, strict=True)]
        seqs = [replace(s, reward=rewards_E[e]) for s, e in zip(seqs, head_of, strict=True)]
        m["kl/reward_penalty_mean"] = sum(pen_E) / max(len(pen_E), 1)
    return seqs, m


def kl_penalties(seqs: list[Sequence], beta: float, estimator: str) -> list[float]:
    """KL to the reference as a reward penalty per sequence, estimated on the sampler's log-probs of its own tokens
    over the loss mask (so a filtered sequence pays none)."""
    T = max((len(s.completion_ids) for s in seqs), default=0)
    if T == 0:
        return [0.0] * len(seqs)
    logp, ref, mask = (torch.zeros(len(seqs), T) for _ in range(3))
    for i, s in enumerate(seqs):
        if s.ref_logprobs is None:
            raise ValueError("KL as a reward needs each sequence's ref_logprobs")
        n = len(s.completion_ids)
        logp[i, :n] = torch.tensor(s.sampler_logprobs)
        ref[i, :n] = torch.tensor(s.ref_logprobs)
        mask[i, :n] = torch.tensor(s.loss_mask, dtype=torch.float32)
    return kl_reward_penalty(logp, ref, mask, beta, estimator).tolist()
