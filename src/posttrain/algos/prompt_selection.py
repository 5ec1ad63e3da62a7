"""Which prompts a step trains on (`loop.prompt_selection`): a registry of pure functions over a per-prompt record.

    record = PromptRecord()                              what each prompt's recent groups did
    rows = SELECTIONS[name](record, n_rows, k, step, seed, settings)   the step's k row indices
    record.observe(step, groups)                         after scoring: pass counts and spread per prompt

Why: drawn uniformly, a prompt the policy has mastered costs a whole group of rollouts and teaches nothing (every
sample passes, every advantage is 0), and so does a prompt nothing passes. On the demo, 19 of 40 RL steps were such
steps. `adaptive` spends the step where the policy can still learn:

- **fresh** prompts (never sampled) come in the run's seeded epoch order, as `uniform` would draw them;
- **learnable** prompts (seen, some spread or some passes but not all) are replayed, least recently seen first;
  they get `replay_share` of each step's slots;
- **mastered** prompts (every sample passed in each of the last `retire_after` groups) are retired, and
  **hopeless** ones (no pass and no reward spread in each of the last `backoff_after` groups) are backed off:
  neither is drawn again until `revisit_every` steps after it was last seen, and then only in the step's
  revisit slots (at most `revisit_slots`), oldest first, so forgetting or a late first pass shows;
- a remedy (a change of how rollouts are sampled) un-backs every hopeless prompt: what nothing passed may pass now.

The functions are pure (the record, the step and the seed decide everything), so a resumed run draws exactly what
the uninterrupted run drew; the run keeps the record (loop/prompt_selector.py) and saves it with its checkpoint.
Bounds, tested as properties: a retired or backed-off prompt is drawn at most once per `revisit_every` steps while
enough other prompts exist, and a fresh prompt is drawn within ceil(n_rows / fresh slots) steps of the run's start.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from posttrain.algos.registry import Registry


@dataclass(frozen=True)
class SelectionSettings:
    """loop.selection.* (config/schema.py)."""

    replay_share: float = 0.5
    retire_after: int = 1
    backoff_after: int = 2
    revisit_every: int = 20
    revisit_slots: int = 1


@dataclass
class PromptStats:
    """One prompt's recent groups: (passed samples, samples, reward spread > 0) per group, newest last."""

    last_step: int = -1
    groups: list[tuple[int, int, bool]] = field(default_factory=list)
    backoff_cleared: bool = False  # a remedy arrived since it was backed off: treat as learnable once more

    def state(self, retire_after: int, backoff_after: int) -> str:
        """fresh | learnable | mastered | hopeless."""
        if not self.groups:
            return "fresh"
        recent = self.groups[-retire_after:]
        if len(recent) == retire_after and all(p == n and n > 0 for p, n, _ in recent):
            return "mastered"
        recent = self.groups[-backoff_after:]
        if (
            not self.backoff_cleared
            and len(recent) == backoff_after
            and all(p == 0 and not spread for p, _, spread in recent)
        ):
            return "hopeless"
        return "learnable"


KEEP = 8  # groups remembered per prompt: more than any retire_after / backoff_after a user would set


class PromptRecord:
    """Per-prompt stats, keyed by row index; what the selection reads and the checkpoint saves."""

    def __init__(self) -> None:
        self.stats: dict[int, PromptStats] = {}

    def get(self, row: int) -> PromptStats:
        return self.stats.get(row) or PromptStats()

    def observe(self, step: int, groups: Iterable[Any]) -> None:
        """Record each scored group (a `Group`: task_index and trajectories_G) under its row."""
        for g in groups:
            trajs = [t for t in g.trajectories_G if not getattr(t, "failed", False)]
            if not trajs:  # every sample failed in the host (a crash, a timeout): says nothing about the prompt
                continue
            rewards = [float(t.reward) for t in trajs]
            s = self.stats.setdefault(int(g.task_index), PromptStats())
            s.last_step = step
            s.groups = (
                s.groups + [(sum(bool(t.passed) for t in trajs), len(trajs), max(rewards) - min(rewards) > 1e-9)]
            )[-KEEP:]
            s.backoff_cleared = False

    def clear_backoff(self) -> None:
        """A remedy changed how rollouts are sampled: backed-off prompts may pass now."""
        for s in self.stats.values():
            s.backoff_cleared = True

    def counts(self, settings: SelectionSettings) -> dict[str, int]:
        out = {"learnable": 0, "mastered": 0, "hopeless": 0}
        for s in self.stats.values():
            st = s.state(settings.retire_after, settings.backoff_after)
            if st in out:
                out[st] += 1
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "stats": [
                [i, s.last_step, [list(g) for g in s.groups], s.backoff_cleared] for i, s in sorted(self.stats.items())
            ]
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stats = {
            int(i): PromptStats(int(last), [(int(p), int(n), bool(sp)) for p, n, sp in groups], bool(c))
            for i, last, groups, c in state.get("stats", [])
        }


def epoch_order(n_rows: int, epoch: int, seed: int) -> list[int]:
    """The run's seeded order of the rows in one epoch (loop/collect.py's prompts_for_step draws the same)."""
    order = list(range(n_rows))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return order


Selection = Callable[[PromptRecord, int, int, int, int, SelectionSettings], list[int]]
SELECTIONS: Registry[Selection] = Registry("prompt selection")


def prompts_for_step(n_rows: int, step: int, per_step: int, seed: int) -> list[int]:
    """Row indices for a step: epochs over a seeded shuffle. A pure function of the step, so resume needs no
    data-loader state beyond the step number."""
    orders: dict[int, list[int]] = {}
    out = []
    for j in range(step * per_step, (step + 1) * per_step):
        epoch, pos = divmod(j, n_rows)
        if epoch not in orders:
            orders[epoch] = epoch_order(n_rows, epoch, seed)
        out.append(orders[epoch][pos])
    return out


@SELECTIONS.register("uniform")
def uniform(record: PromptRecord, n_rows: int, k: int, step: int, seed: int, s: SelectionSettings) -> list[int]:
    """Epochs over a seeded shuffle, whatever the record says (the default before `adaptive`)."""
    return prompts_for_step(n_rows, step, k, seed)


@SELECTIONS.register("adaptive")
def adaptive(record: PromptRecord, n_rows: int, k: int, step: int, seed: int, s: SelectionSettings) -> list[int]:
    """k distinct rows (fewer only when n_rows < k): revisits, then replays, then fresh prompts (module docstring)."""
    k_eff = min(k, n_rows)
    by_state: dict[str, list[int]] = {"fresh": [], "learnable": [], "mastered": [], "hopeless": []}
    for i in range(n_rows):
        by_state[record.get(i).state(s.retire_after, s.backoff_after)].append(i)

    def oldest_first(rows: list[int]) -> list[int]:  # ties: the seeded order of this step, not the row number
        tie = {r: j for j, r in enumerate(epoch_order(n_rows, step, seed))} if len(rows) > 1 else {}
        return sorted(rows, key=lambda r: (record.get(r).last_step, tie.get(r, 0)))

    parked = by_state["mastered"] + by_state["hopeless"]
    due = oldest_first([r for r in parked if step - record.get(r).last_step >= s.revisit_every])
    chosen: list[int] = due[: min(s.revisit_slots, k_eff)]
    n_replay = min(len(by_state["learnable"]), math.ceil((k_eff - len(chosen)) * s.replay_share))
    chosen += oldest_first(by_state["learnable"])[:n_replay]
    # Fresh prompts in the run's own seeded order: the first epoch's order, skipping any already sampled.
    fresh = set(by_state["fresh"])
    epoch = 0
    while len(chosen) < k_eff and fresh:
        for r in epoch_order(n_rows, epoch, seed):
            if r in fresh:
                chosen.append(r)
                fresh.discard(r)
                if len(chosen) == k_eff:
                    break
        epoch += 1
    # Not enough fresh prompts: more replays, then more revisits due, then the least recently seen of the rest.
    taken = set(chosen)
    for pool in (oldest_first(by_state["learnable"]), due, oldest_first(parked)):
        for r in pool:
            if len(chosen) == k_eff:
                return chosen
            if r not in taken:
                chosen.append(r)
                taken.add(r)
    return chosen
