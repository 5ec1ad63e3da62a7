"""Which task rows a step rolls out: the `RowChooser` a collector is built with.

    UniformRows       loop.prompt_selection=uniform: a seeded permutation per epoch (algos/prompt_selection.py)
    PromptSelector    any other loop.prompt_selection: the registered function over each prompt's record
                      (loop/prompt_selector.py), which learns from the scored groups
    RisedRows         algorithm.rised.selection: rows by behaviour profile out of a larger seeded pool
                      (guidance/profiles.py `Rised.choose`)

A collector asks `rows_for(step, k, rows)` once per step (the async collector: when the step's first group
starts) and hands every scored group back through `observe`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from posttrain.algos.prompt_selection import prompts_for_step
from posttrain.types import Group


class RowChooser(Protocol):
    def rows_for(self, step: int, k: int, rows: Sequence[dict[str, Any]]) -> list[int]:
        """k indices into `rows` (the collector's current rows) for step `step`."""
        ...

    def observe(self, step: int, groups: list[Group]) -> None:
        """Every group the step scored, kept or not."""
        ...


class UniformRows:
    """Every row once per epoch, in a seeded order: what a step draws depends only on the seed and the step."""

    def __init__(self, seed: int):
        self.seed = seed

    def rows_for(self, step: int, k: int, rows: Sequence[dict[str, Any]]) -> list[int]:
        return prompts_for_step(len(rows), step, k, self.seed)

    def observe(self, step: int, groups: list[Group]) -> None:
        """Uniform draws learn nothing."""


class ProfileChooser(Protocol):
    def pool_size(self, k: int) -> int: ...

    def choose(self, step: int, pool: list[int], rows: list[dict[str, Any]], k: int) -> list[int]: ...


class RisedRows:
    """RISED's selection: k rows chosen by profile out of a seeded pool of `chooser.pool_size(k)` (its profiles
    learn from the tags the env wrapper writes, not from `observe`)."""

    def __init__(self, chooser: ProfileChooser, seed: int):
        self.chooser, self.seed = chooser, seed

    def rows_for(self, step: int, k: int, rows: Sequence[dict[str, Any]]) -> list[int]:
        pool = prompts_for_step(len(rows), step, self.chooser.pool_size(k), self.seed)
        return self.chooser.choose(step, pool, list(rows), k)

    def observe(self, step: int, groups: list[Group]) -> None:
        """The profiles are updated as rollouts are tagged (guidance/profiles.py ProfileEnv)."""
