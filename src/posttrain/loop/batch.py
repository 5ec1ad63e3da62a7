"""Batch assembly for a policy-gradient step: scored groups in, one Batch out.

    number_samples(groups) -> groups   each trajectory numbered (sample_id): the key results find it by
    sequences_from_groups(groups)      the Sequences of each trajectory that did not fail, with its shaped reward
    with_logprobs(seqs, field, lps)    new sequences with reference / teacher / behaviour log-probs set
    build_batch(sequences, options)    advantages per group from the shaped rewards -> the trained part
    sample_stats(shown, batch, kept)   what the report shows of the shown trajectories, by sample_id

`build_batch` is a pure function: it never mutates its inputs, and everything it needs per sequence (reward,
group, loss mask) is a field of the sequence, so filtering is subsetting one list. It reads rewards, it never works
one out: shaping is loop/shaping.py's, the DAPO overlong penalty when a group is scored (the group filter of
dynamic sampling must see it), the overlong filter and KL-as-reward on the sequences, once their reference
log-probs are in (`shaped_sequences`, right before `build_batch`).

An episode may train as several sequences, its pieces (an agent whose calls did not extend one another:
Trajectory.extra_chains, `Sequence.episode`). The episode is still the unit of the group: its KL penalty is the sum
over its pieces (loop/shaping.py), its advantage is computed once (one reward per episode in the group's
statistics) and given to every piece, and the batch's `total_seqs` counts episodes; the aggregation weighs each
piece by its share of the episode's tokens (algos/aggregation.py), so an episode weighs the same in the loss
however many pieces it became.
"""

from __future__ import annotations

import collections.abc as abc
import itertools
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from posttrain.algos.advantages import ADVANTAGES
from posttrain.config.schema import AlgorithmConfig
from posttrain.types import Batch, Group, SampleStats, Sequence, Trajectory, sequences_of


@dataclass(frozen=True)
class BatchOptions:
    advantage: str = "grpo"  # advantage estimator, by registry name
    scale_std: bool = True
    # > 0: KL to the reference as a per-episode reward penalty (needs ref_logprobs; loop/shaping.py applies it)
    kl_reward_beta: float = 0.0
    kl_estimator: str = "k3"
    overlong_filter: bool = False  # DAPO: truncated completions get no loss (loop/shaping.py applies it)
    # With a KL term in the loss (to a reference or a distillation teacher) every sequence contributes; without
    # one, a sequence whose advantage is 0 contributes exactly 0 (every registered loss is A times something), so
    # only the rest needs a forward pass. A sequence a teacher scored always contributes (its distillation term).
    keep_zero_advantage: bool = False

    @classmethod
    def from_config(cls, a: AlgorithmConfig) -> BatchOptions:
        return cls(
            advantage=a.advantage,
            scale_std=a.scale_std,
            kl_reward_beta=a.beta if a.kl_mode == "reward" else 0.0,
            kl_estimator=a.kl_estimator,
            overlong_filter=a.overlong_filter,
            keep_zero_advantage=(a.beta > 0 and a.kl_mode == "loss") or a.teacher.model is not None,
        )


HintFn = Callable[[Trajectory], "tuple[str, int | None] | None"]  # (hint text, turn index; None: the last turn)


def feedback_hint(t: Trajectory, template: str = "\n\nHint: {hint}") -> tuple[str, int | None] | None:
    """algorithm.hint_distill: the sample's own feedback written with `template`, at the turn it is about."""
    return (template.format(hint=t.feedback), t.feedback_turn) if t.feedback else None


def remedy_hint(t: Trajectory, template: str = "\n\nHint: {hint}") -> tuple[str, int | None] | None:
    """A remedy's format hint for a stalled sample (diagnostics.remedies, guide mode), before the first reply."""
    hint = t.guidance.remedy_hint
    return (template.format(hint=hint), 0) if hint else None


def first_hint(*fns: HintFn | None) -> HintFn:
    """The first hint any of `fns` gives a trajectory."""
    live = [f for f in fns if f is not None]

    def fn(t: Trajectory) -> tuple[str, int | None] | None:
        return next((h for h in (f(t) for f in live) if h is not None), None)

    return fn


def env_hint(t: Trajectory) -> tuple[str, int | None] | None:
    """algorithm.insights / rised: the hint the env wrote for this sample's teacher (its task's insights, or the
    positive behaviours it missed), in the first prompt."""
    hint = t.guidance.teacher_hint
    return (hint, 0) if hint else None


def sequences_from_groups(groups: list[Group], hint_fn: HintFn | None = None) -> list[Sequence]:
    """Every trajectory that did not fail, as Sequences whose group_id is its group's position: one, or one per
    chain of a trajectory with extra chains (`sequences_of`; its pieces numbered by the trajectory's position here,
    so they are unique in the batch). `hint_fn` picks the hint a self-distillation teacher will read for each (None:
    no hints)."""
    trajs = [(gi, t) for gi, g in enumerate(groups) for t in g.trajectories_G]
    return [
        s
        for k, (gi, t) in enumerate(trajs)
        if not t.failed
        for s in sequences_of(t, group_id=gi, hint=hint_fn(t) if hint_fn else None, episode=k)
    ]


def episode_heads(seqs: list[Sequence]) -> tuple[list[int], list[int]]:
    """(the index of each episode's first sequence, the position in that list of each sequence's episode): a whole
    sequence is an episode of its own, the pieces of one episode (same `episode`) share one."""
    heads: list[int] = []
    head_of: list[int] = []
    seen: dict[int, int] = {}
    for i, s in enumerate(seqs):
        if s.episode is None or s.episode not in seen:
            if s.episode is not None:
                seen[s.episode] = len(heads)
            heads.append(i)
            head_of.append(len(heads) - 1)
        else:
            head_of.append(seen[s.episode])
    return heads, head_of


def number_samples(groups: list[Group]) -> list[Group]:
    """The groups with every trajectory numbered: its `sample_id` is its position over the step's groups, the key its
    Sequence carries through batch assembly and the trainer, so per-sample results find their trajectory. Pure."""
    n = itertools.count()
    return [Group(g.task_index, [replace(t, sample_id=next(n)) for t in g.trajectories_G]) for g in groups]


def with_logprobs(seqs: list[Sequence], name: str, logprobs: abc.Sequence[Any]) -> list[Sequence]:
    """The sequences with one per-token field (ref_logprobs, teacher_logprobs, old_logprobs) set from a scorer's
    answer, which lists one entry per sequence in the order it was asked (Trainer.compute_logprobs, Teacher)."""
    if len(logprobs) != len(seqs):
        raise ValueError(f"{name}: {len(logprobs)} answers for {len(seqs)} sequences")
    return [replace(s, **{name: lp}) for s, lp in zip(seqs, logprobs, strict=True)]


def sample_stats(shown: list[Trajectory], batch: Batch, learner: dict[int, list[float]]) -> dict[int, SampleStats]:
    """What the report shows of each shown trajectory, by sample_id: the advantage it was trained with (every
    scored sequence's, `batch.advantage_of`) and its learner log-probs before the update (`learner`: the update's
    Update.logprobs and, for rows outside it, a pass before it). Pure."""
    out: dict[int, SampleStats] = {}
    for t in shown:
        if t.sample_id is None:
            continue
        lp = learner.get(t.sample_id)
        out[t.sample_id] = SampleStats(
            advantage=batch.advantage_of.get(t.sample_id),
            learner_logprobs=[round(x, 4) for x in lp] if lp is not None else None,
        )
    return out


def build_batch(seqs: list[Sequence], opts: BatchOptions, policy_version: int = 0) -> tuple[Batch, dict[str, float]]:
    """The optimizer batch from scored and shaped sequences (loop/shaping.py `shaped_sequences`: the overlong filter
    and KL-as-reward), and its metrics: it reads each episode's reward, it never changes one. Normalizers count
    every sequence, the trained part is the sequences that change the update."""
    m: dict[str, float] = {}
    heads, head_of = episode_heads(seqs)
    rewards_E = [seqs[i].reward for i in heads]  # one per episode, as shaped (loop/shaping.py `shaped_sequences`)
    adv_E = (
        ADVANTAGES[opts.advantage](
            torch.tensor(rewards_E, dtype=torch.float32),
            torch.tensor([seqs[i].group_id for i in heads]),
            scale_std=opts.scale_std,
        )
        if seqs
        else torch.zeros(0)
    )
    adv = adv_E.tolist()
    seqs = [replace(s, advantage=adv[e]) for s, e in zip(seqs, head_of, strict=True)]
    keep = [
        i
        for i, s in enumerate(seqs)
        if opts.keep_zero_advantage or ((s.advantage != 0.0 or s.teacher_logprobs is not None) and any(s.loss_mask))
    ]
    batch = Batch(
        sequences=[seqs[i] for i in keep],
        policy_version=policy_version,
        total_loss_tokens=float(max(sum(sum(s.loss_mask) for s in seqs), 1)),
        total_seqs=float(max(len(heads), 1)),  # episodes: the pieces of one count once
        advantage_of={s.sample_id: s.advantage for s in seqs if s.sample_id is not None},
    )
    trained = batch.sequences
    m.update(
        {
            "adv/mean": float(adv_E.mean()) if len(adv_E) else 0.0,
            "adv/std": float(adv_E.std()) if len(adv_E) > 1 else 0.0,
            "adv/abs_max": float(adv_E.abs().max()) if len(adv_E) else 0.0,
            "tokens/trained": float(batch.num_tokens),
            "train/zero_adv_seqs_skipped": float(len(seqs) - len(trained)),
        }
    )
    return batch, m
