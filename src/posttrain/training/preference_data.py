"""The data side of `posttrain rm train` (training/reward_model_fit.py, whose docstring lists the sources):
chosen/rejected pairs (`PreferencePair`) loaded from a built-in generator, a JSONL/JSON file, a `datasets` folder
or the hub (`load_pairs`), checked row by row (`PreferenceDataError` names the row and what is wrong with it), and
split into train and held-out pairs (`split_pairs`). Separate from the fitting (the model, the loss, the training
loop), which only reads the pairs these return."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posttrain.bounded_files import path_kind
from posttrain.errors import PosttrainError
from posttrain.rewards.reward_model import format_pair
from posttrain.rewards.rows_file import read_rows
from posttrain.rows import is_hf_dataset

BUILTIN_PREFERENCES: dict[str, str] = {"product-blurb": "posttrain.tasks.product_blurb"}


@dataclass(frozen=True)
class PreferencePair:
    prompt: Any  # a string, a list of chat messages, or None (the response is the whole text)
    chosen: str
    rejected: str
    kind: str | None = None  # an optional `kind` column: held-out accuracy is also reported per kind

    @property
    def texts(self) -> tuple[str, str]:
        return format_pair(self.prompt, self.chosen), format_pair(self.prompt, self.rejected)


class PreferenceDataError(PosttrainError, ValueError):
    pass


def _response(v: Any, what: str, i: int) -> tuple[str, Any]:
    """(response text, the messages before it or None)."""
    if isinstance(v, str):
        return v, None
    if isinstance(v, list) and v and all(isinstance(m, dict) and "content" in m for m in v):
        return str(v[-1]["content"]), (v[:-1] or None)
    raise PreferenceDataError(
        f"pair {i}: {what!r} must be a string or a list of chat messages, got {type(v).__name__}: {str(v)[:120]}"
    )


def to_pairs(rows: list[dict[str, Any]], source: str = "data") -> list[PreferencePair]:
    out = []
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise PreferenceDataError(
                f"{source}: row {i} is a {type(row).__name__}, expected an object with prompt/chosen/rejected"
            )
        missing = [k for k in ("chosen", "rejected") if k not in row]
        if missing:
            raise PreferenceDataError(
                f"{source}: row {i} has no {' or '.join(missing)} column (columns: "
                f"{sorted(row)}); a preference row needs prompt, chosen and rejected"
            )
        chosen, ctx = _response(row["chosen"], "chosen", i)
        rejected, _ = _response(row["rejected"], "rejected", i)
        if not chosen.strip() or not rejected.strip():
            raise PreferenceDataError(f"{source}: row {i} has an empty chosen or rejected response")
        prompt = row.get("prompt", ctx)
        if prompt is not None and not isinstance(prompt, (str, list)):
            raise PreferenceDataError(
                f"{source}: row {i} prompt must be a string or chat messages, got {type(prompt).__name__}"
            )
        kind = row.get("kind")
        out.append(PreferencePair(prompt, chosen, rejected, None if kind is None else str(kind)))
    return out


def _read_file(path: Path) -> list[dict[str, Any]]:
    return read_rows(path, PreferenceDataError, "preference")  # within rows_file's caps


def load_pairs(source: Any, seed: int = 0) -> tuple[list[PreferencePair], list[PreferencePair] | None]:
    """(train pairs, held-out pairs or None when the source has no split of its own)."""
    if is_hf_dataset(source):
        return to_pairs(source.to_list(), "dataset"), None
    if isinstance(source, dict) and "train" in source:  # a datasets.DatasetDict or {"train": rows, ...}
        held = source.get("test") or source.get("validation")
        rows = lambda d: d.to_list() if is_hf_dataset(d) else list(d)
        return to_pairs(rows(source["train"]), "train"), (to_pairs(rows(held), "held-out") if held else None)
    if isinstance(source, list):
        return to_pairs(source), None
    name = str(source)
    if name in BUILTIN_PREFERENCES:
        import importlib

        gen = importlib.import_module(BUILTIN_PREFERENCES[name]).preference_pairs
        train, held = gen(seed=seed)
        return to_pairs(train, name), to_pairs(held, name)
    if name.startswith("hf:"):
        from datasets import load_dataset

        ds_name, _, split = name[3:].partition(":")
        ds = load_dataset(ds_name, split=split or "train")
        return to_pairs(ds.to_list(), name), None
    p = Path(name).expanduser()
    kind = path_kind(p, PreferenceDataError)  # a symlink loop, a FIFO, a device: refused with what it is
    if kind == "dir":
        from datasets import load_from_disk

        return load_pairs(load_from_disk(str(p)), seed)
    if kind is None:
        raise PreferenceDataError(
            f"preference data not found: {name!r}; use a built-in "
            f"({', '.join(BUILTIN_PREFERENCES)}), a .jsonl file, a saved datasets folder "
            "or hf:<dataset>[:<split>]"
        )
    return to_pairs(_read_file(p), str(p)), None


def split_pairs(
    pairs: list[PreferencePair], eval_frac: float, seed: int, max_eval: int = 500
) -> tuple[list[PreferencePair], list[PreferencePair]]:
    order = list(range(len(pairs)))
    random.Random(seed).shuffle(order)
    n_eval = min(max_eval, max(1, round(len(pairs) * eval_frac))) if len(pairs) > 1 else 0
    return [pairs[i] for i in order[n_eval:]], [pairs[i] for i in order[:n_eval]]
