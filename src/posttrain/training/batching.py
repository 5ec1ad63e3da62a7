"""Split a Batch into micro-batches by token budget, bucketing by length so little padding is computed.

Sequences of one group share their prompt; a micro-batch holds whole groups so that the trainer can compute
each prompt once (prefix sharing). Cost of a micro-batch = P * max_prompt_len + N * max_completion_len, the
number of positions the forward actually computes, padding included.
"""

from __future__ import annotations

from dataclasses import dataclass

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


def micro_batch_cost(groups: list[GroupSlice]) -> int:
    if not groups:
        return 0
    lp = max(len(g.prompt_ids) for g in groups)
    lc = max(g.max_completion for g in groups)
    n = sum(len(g.sequences) for g in groups)
    return len(groups) * lp + n * lc


def plan_micro_batches(batch: Batch, max_tokens: int) -> list[list[GroupSlice]]:
    """Greedy length bucketing: sort groups by size, fill each micro-batch while it stays under budget.

    A single group larger than the budget still forms its own micro-batch (we never split a group).
    """
    groups = sorted(group_sequences(batch), key=lambda g: (len(g.prompt_ids), g.max_completion))
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
