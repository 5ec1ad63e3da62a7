"""Dynamic sampling with refill (DAPO, arXiv:2503.14476, sec. 3.2): keep only groups that carry a learning signal
and sample more prompts until the batch is full again.

A group whose G rewards are all equal has zero advantage under every group baseline: it costs a forward and a
backward and teaches nothing. DAPO over-samples and filters; here the loop samples the step's prompts, drops the
groups without signal, and runs at most `max_rounds` extra rounds on fresh prompts, sized by the keep rate seen so
far, until `target` groups are kept. If the rounds run out, the step trains on what it has (fill < 1 in the
metrics) rather than sampling forever on a task the model always or never solves.
"""

from __future__ import annotations

import math
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from posttrain.types import Group


@dataclass
class RefillStats:
    target: int
    kept: int = 0
    sampled_groups: int = 0
    filtered_groups: int = 0
    extra_rounds: int = 0

    def metrics(self) -> dict[str, float]:
        return {
            "dynamic/extra_rounds": float(self.extra_rounds),
            "dynamic/sampled_groups": float(self.sampled_groups),
            "dynamic/filtered_frac": self.filtered_groups / max(self.sampled_groups, 1),
            "dynamic/batch_fill": self.kept / max(self.target, 1),
        }


def refill_rows(n_rows: int, step: int, round_: int, k: int, seed: int, exclude: set[int]) -> list[int]:
    """k row indices for refill round `round_` of `step`: a seeded shuffle of all rows, skipping rows this step
    already used while others remain. A pure function, so resumed runs refill identically."""
    order = list(range(n_rows))
    random.Random((seed * 1_000_003 + step) * 101 + round_).shuffle(order)
    fresh = [i for i in order if i not in exclude]
    pool = fresh + [i for i in order if i in exclude]
    return [pool[i % len(pool)] for i in range(k)]


async def collect_groups(
    sample: Callable[[list[int]], Awaitable[list[Group]]],
    first_rows: list[int],
    more_rows: Callable[[int, int, set[int]], list[int]],
    target: int,
    max_rounds: int,
    keep: Callable[[Group], bool],
) -> tuple[list[Group], list[Group], RefillStats]:
    """Sample `first_rows`, then refill until `target` groups pass `keep` or `max_rounds` extra rounds ran.

    sample(rows) -> groups (rolled out and scored); more_rows(round, k, used) -> k fresh row indices.
    Returns (kept groups, at most target; every group sampled, for logging; stats).
    """
    stats = RefillStats(target=target)
    all_groups = await sample(first_rows)
    used = set(first_rows)
    kept = [g for g in all_groups if keep(g)]
    while len(kept) < target and stats.extra_rounds < max_rounds:
        stats.extra_rounds += 1
        keep_rate = max(len(kept) / max(len(all_groups), 1), 0.25)  # floor: never ask for more than 4x the gap
        need = math.ceil((target - len(kept)) / keep_rate)
        rows = more_rows(stats.extra_rounds, need, used)
        used.update(rows)
        new = await sample(rows)
        all_groups += new
        kept += [g for g in new if keep(g)]
    stats.sampled_groups = len(all_groups)
    stats.filtered_groups = sum(1 for g in all_groups if not keep(g))
    kept = kept[:target]
    stats.kept = len(kept)
    return kept, all_groups, stats
