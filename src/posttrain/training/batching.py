"""Split a Batch into micro-batches by token budget, bucketing by length so little padding is computed.

Sequences of one group share their prompt; a micro-batch holds whole groups where it can, so that the trainer
computes each prompt once (prefix sharing). Cost of a micro-batch = P * max_prompt_len + N * max_completion_len,
the number of positions the forward actually computes, padding included.

A group over the budget is split into parts of its sequences that fit (each part computes the prompt again):
the budget bounds activation memory, which multi-turn groups would otherwise exceed (a coding-agent group of 4
episodes is about 6,500 tokens).
The losses normalise by batch-wide totals, so how a batch is cut never changes the gradient (tested).

The pieces of one episode (Sequence.episode: an agent episode trained as several chains) have different prompts, so
they are slices of their own (the key is the group and the prompt) and may land in different micro-batches; what
the loss needs of them travels per row (`episode_tokens_B`), so that too changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from posttrain.types import Batch, Sequence


@dataclass
class GroupSlice:
    prompt_ids: list[int]
    sequences: list[Sequence]
    indices: list[int]  # each sequence's position in the batch, so results map back without lookups

    @property
    def max_completion(self) -> int:
        return max(len(s.completion_ids) for s in self.sequences)


def group_sequences(batch: Batch) -> list[GroupSlice]:
    """Group sequences by (group_id, prompt) preserving order."""
    groups: dict[tuple[int, tuple[int, ...]], GroupSlice] = {}
    for i, s in enumerate(batch.sequences):
        key = (s.group_id, tuple(s.prompt_ids))
        if key not in groups:
            groups[key] = GroupSlice(prompt_ids=s.prompt_ids, sequences=[], indices=[])
        groups[key].sequences.append(s)
        groups[key].indices.append(i)
    return list(groups.values())


def episode_tokens_B(seqs: list[Sequence], device: Any = None) -> torch.Tensor | None:
    """Per row, the loss tokens of the episode it is a piece of, 0 for a whole sequence (LossInputs.seq_tokens_B);
    None when no row is a piece."""
    if all(s.episode_tokens is None for s in seqs):
        return None
    return torch.tensor([float(s.episode_tokens or 0) for s in seqs], device=device)


def micro_batch_cost(groups: list[GroupSlice]) -> int:
    if not groups:
        return 0
    lp = max(len(g.prompt_ids) for g in groups)
    lc = max(g.max_completion for g in groups)
    n = sum(len(g.sequences) for g in groups)
    return len(groups) * lp + n * lc


def split_group(g: GroupSlice, max_tokens: int) -> list[GroupSlice]:
    """`g` as parts that each cost at most `max_tokens` (longest completions first, so parts are even in length);
    `g` itself when it fits. A part holds at least one sequence."""
    if micro_batch_cost([g]) <= max_tokens:
        return [g]
    order = sorted(range(len(g.sequences)), key=lambda k: -len(g.sequences[k].completion_ids))
    parts: list[GroupSlice] = []
    for k in order:
        s, i = g.sequences[k], g.indices[k]
        last = parts[-1] if parts else None
        if last is not None and len(g.prompt_ids) + (len(last.sequences) + 1) * last.max_completion <= max_tokens:
            last.sequences.append(s)  # sorted longest first: the part's longest completion stays its first
            last.indices.append(i)
        else:
            parts.append(GroupSlice(prompt_ids=g.prompt_ids, sequences=[s], indices=[i]))
    return parts


def plan_micro_batches(batch: Batch, max_tokens: int) -> list[list[GroupSlice]]:
    """Greedy length bucketing: sort groups by size, fill each micro-batch while it stays under budget.

    A group over the budget is first split into parts that fit; a single sequence over the budget still forms its
    own micro-batch (a sequence is never cut).
    """
    parts = [p for g in group_sequences(batch) for p in split_group(g, max_tokens)]
    groups = sorted(parts, key=lambda g: (len(g.prompt_ids), g.max_completion))
    plans: list[list[GroupSlice]] = []
    current: list[GroupSlice] = []
    for g in groups:
        if current and micro_batch_cost(current + [g]) > max_tokens:
            plans.append(current)
            current = []
        current.append(g)
    if current:
        plans.append(current)
    return plans
