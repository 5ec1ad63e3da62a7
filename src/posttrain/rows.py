"""Rows: the lists of dicts every task and data file is made of, and what every loader does with them the same way:
their columns, the seeded held-out split, a `datasets.Dataset` told apart from a list."""

from __future__ import annotations

import random
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeGuard, TypeVar

if TYPE_CHECKING:
    from datasets import Dataset

R = TypeVar("R")

HELD_OUT_CAP = 64  # the default share's cap: enough rows for a stable eval, few enough to keep it quick


def columns(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """Every key of any row, in the order first seen."""
    seen: dict[str, None] = {}
    for r in rows:
        seen.update(dict.fromkeys(r))
    return list(seen)


def is_hf_dataset(obj: object) -> TypeGuard[Dataset]:
    """Whether `obj` is a `datasets.Dataset`. Never imports `datasets`: an object of its class exists only once
    the module is imported."""
    datasets = sys.modules.get("datasets")
    cls = getattr(datasets, "Dataset", None)
    return isinstance(cls, type) and isinstance(obj, cls)


def held_out_count(n_rows: int, fraction: float | None = None, count: int | None = None) -> int:
    """How many of `n_rows` rows `hold_out` holds out. Fewer than 2 rows: none (the one row trains, there is no
    eval set). Otherwise `count` if given, else `round(n_rows * fraction)` and at least 1, else by default 10%
    rounded down, at least 1 and at most HELD_OUT_CAP; never every row (at least one row trains)."""
    if count is not None and count < 0:
        raise ValueError(f"cannot hold out {count} rows")
    if fraction is not None and not 0.0 < fraction < 1.0:
        raise ValueError(f"the held-out share must be between 0 and 1, got {fraction}")
    if n_rows < 2:
        return 0
    if count is not None:
        k = count
    elif fraction is not None:
        k = max(1, round(n_rows * fraction))
    else:
        k = min(HELD_OUT_CAP, max(1, n_rows // 10))
    return min(k, n_rows - 1)


def hold_out(
    rows: Sequence[R], fraction: float | None = None, seed: int = 0, *, count: int | None = None
) -> tuple[list[R], list[R]]:
    """(train, held out): `held_out_count` rows drawn at random with `seed`, the rest in their shuffled order."""
    k = held_out_count(len(rows), fraction, count)
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    return [rows[i] for i in order[k:]], [rows[i] for i in order[:k]]
