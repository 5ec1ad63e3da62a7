"""A task from data, by config alone (`task.dataset`): rows from a file, a folder or a `datasets` dataset, the
prompt from a column or a template, and the rewards named in `task.rewards` (rewards/named.py).

    posttrain train task.dataset=examples/data/arith.jsonl task.prompt_column=question 'task.rewards=[{fn: math}]'

Where the rows come from (never the network):
    a file            .jsonl, .json (a list of objects), .parquet, .csv, .arrow: one split, `train`
    a folder          files named by split (train.jsonl, test.parquet, train-00000-of-00002.parquet), or a
                      `datasets` save_to_disk folder (a DatasetDict: its splits; a Dataset: `train`)
    a dataset name    one in the local Hugging Face cache, loaded offline (NAME or NAME:CONFIG)

Each row keeps its columns (the reward functions get them by name, TRL's convention) and gets `prompt`: the
`task.prompt_column` (a string, or a list of chat messages) or `task.prompt_template` formatted with the row, with
`task.system_prompt` before it. Every problem is a TaskLoadError in one line naming the data and what to do.

A data file is input from outside the process: it is read through rewards/rows_file.py within its caps (one line,
a file's bytes, a row's nesting; a regular file only, never a FIFO), and `task.max_rows` stops reading once that
many rows are read. A path that is there but is no file or folder (a symlink loop, a FIFO, a device) is refused
with what it is; a folder is walked to at most MAX_FOLDER_ENTRIES entries.
"""

from __future__ import annotations

import contextlib
import os
import re
import string
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeGuard

from posttrain.bounded_files import ErrorType, path_kind
from posttrain.config.schema import TaskConfig
from posttrain.envs.task import Task, TaskLoadError
from posttrain.rewards import rows_file
from posttrain.rewards.from_config import RewardConfigError, check_columns, rubric_from_specs
from posttrain.rows import columns, hold_out, is_hf_dataset

Rows = list[dict[str, Any]]


# ------------------------------------------------------------------------------------------------- reading files

Reader = Callable[[Path, ErrorType, int | None], Rows]

# Every reader is bounded (rewards/rows_file.py LIMITS): a line, a file's bytes, a row's nesting; `limit` stops it
# once task.max_rows rows are read.
READERS: dict[str, Reader] = {
    ".jsonl": rows_file.jsonl_rows,
    ".json": rows_file.json_rows,
    ".parquet": rows_file.parquet_rows,
    ".csv": rows_file.csv_rows,
    ".arrow": rows_file.arrow_rows,
}
_KINDS = ", ".join(READERS)
# A folder is walked for its data files; past this many entries it is not a dataset's folder.
MAX_FOLDER_ENTRIES = 100_000


def _error(message: str) -> TaskLoadError:
    return TaskLoadError(f"task.dataset {message}")


def read_file(path: Path, limit: int | None = None) -> Rows:
    """The rows of one data file (the first `limit`); TaskLoadError when its extension is unknown or it cannot be
    read."""
    reader = READERS.get(path.suffix.lower())
    if reader is None:
        raise TaskLoadError(
            f"task.dataset {path}: unknown extension {path.suffix or '(none)'!r}; use a {_KINDS} "
            "file, a folder of them, or a datasets save_to_disk folder"
        )
    try:
        rows = reader(path, _error, limit)
    except TaskLoadError:
        raise
    except (OSError, UnicodeDecodeError, ValueError, ImportError) as e:  # what a reader did not foresee
        raise TaskLoadError(
            f"task.dataset {path}: cannot read it as {path.suffix} ({type(e).__name__}: {_first_line(e)})"
        ) from None
    bad = next((i for i, r in enumerate(rows) if not isinstance(r, dict)), None)
    if bad is not None:
        raise TaskLoadError(
            f"task.dataset {path}: row {bad} is a {type(rows[bad]).__name__}, not an object with columns"
        )
    return rows


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [""])[0][:200]


# ------------------------------------------------------------------------------------------------------- sources

Split = Callable[[int | None], Rows]  # the first N rows of a split (None: all)


def _split_of(path: Path) -> str:
    """A data file's split, from its name as the Hub lays them out: train.jsonl, test-00000-of-00001.parquet."""
    return re.split(r"[-.]", path.name, maxsplit=1)[0]


def _walk(folder: Path) -> Iterator[Path]:
    """Every entry under `folder` that is not a folder, hidden ones and symlinked folders left out, at most
    MAX_FOLDER_ENTRIES of them."""
    seen = 0
    for root, dirs, files in os.walk(folder):  # symlinked folders are listed, never entered
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            seen += 1
            if seen > MAX_FOLDER_ENTRIES:
                raise TaskLoadError(
                    f"task.dataset {folder}: the folder holds more than {MAX_FOLDER_ENTRIES:,} files; point "
                    "task.dataset at the folder of the data files"
                )
            if not name.startswith("."):
                yield Path(root) / name


def _folder_files(folder: Path) -> dict[str, list[Path]]:
    # Not only regular files: a FIFO or a broken link named train.jsonl is reported when read, not skipped.
    out: dict[str, list[Path]] = {}
    for p in sorted(_walk(folder)):
        if p.suffix.lower() in READERS:
            out.setdefault(_split_of(p), []).append(p)
    return out


def _read_files(paths: list[Path], limit: int | None) -> Rows:
    rows: Rows = []
    for p in paths:
        rows += read_file(p, None if limit is None else limit - len(rows))
        if limit is not None and len(rows) >= limit:
            break
    return rows


def _is_saved_dataset(folder: Path) -> bool:
    return (folder / "dataset_dict.json").exists() or (folder / "state.json").exists()


def _bounded_split(ds: Any, where: str) -> Split:
    """A `datasets` split's rows, refused when what they would take in memory is over the data cap."""

    def rows(limit: int | None) -> Rows:
        n = len(ds) if limit is None else min(limit, len(ds))
        nbytes = ds.data.nbytes * n // max(len(ds), 1)
        if nbytes > rows_file.LIMITS.data_bytes:
            raise TaskLoadError(
                f"task.dataset {where}: {n:,} rows take {nbytes:,} bytes, more than "
                f"{rows_file.LIMITS.data_bytes:,}; set task.max_rows to read fewer"
            )
        return (ds if n == len(ds) else ds.select(range(n))).to_list()

    return rows


def _datasets_splits(obj: Any, where: str) -> dict[str, Split]:
    if is_hf_dataset(obj):
        return {"train": _bounded_split(obj, where)}  # a Dataset: one split
    return {name: _bounded_split(ds, where) for name, ds in obj.items()}  # a DatasetDict


def _load_saved(folder: Path) -> dict[str, Split]:
    from datasets import load_from_disk

    try:
        return _datasets_splits(load_from_disk(str(folder)), str(folder))
    except Exception as e:  # noqa: BLE001 - datasets raises many kinds for a folder it cannot load
        raise TaskLoadError(f"task.dataset {folder}: cannot load this datasets folder ({_first_line(e)})") from None


@contextlib.contextmanager
def _offline() -> Iterator[None]:
    """`datasets` and the Hub client offline while the block runs: a cached dataset loads, nothing is fetched."""
    import datasets.config
    import huggingface_hub.constants as hub

    saved = (datasets.config.HF_HUB_OFFLINE, hub.HF_HUB_OFFLINE, os.environ.get("HF_DATASETS_OFFLINE"))
    datasets.config.HF_HUB_OFFLINE = hub.HF_HUB_OFFLINE = True
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, hub.HF_HUB_OFFLINE = saved[0], saved[1]
        if saved[2] is None:
            os.environ.pop("HF_DATASETS_OFFLINE", None)
        else:
            os.environ["HF_DATASETS_OFFLINE"] = saved[2]


def _load_cached(name: str, cache_dir: str | None = None) -> dict[str, Split]:
    from datasets import load_dataset

    repo, _, config = name.removeprefix("hf:").partition(":")
    try:
        with _offline():
            return _datasets_splits(load_dataset(repo, config or None, cache_dir=cache_dir), repr(name))
    except Exception as e:  # noqa: BLE001 - datasets raises many kinds; all mean "not here offline"
        raise TaskLoadError(
            f"task.dataset {name!r} is not a file or folder, nor a dataset in the local Hugging Face "
            f"cache ({type(e).__name__}); posttrain never downloads: on a machine with network run "
            f"datasets.load_dataset({repo!r}).save_to_disk(DIR) and set task.dataset=DIR"
        ) from None


def _looks_like_path(name: str) -> bool:
    return (
        name.startswith((".", "/", "~"))
        or Path(name).suffix.lower() in READERS
        or os.sep in name
        and Path(name.split(os.sep)[0]).exists()
    )


def dataset_splits(dataset: str, cache_dir: str | None = None) -> dict[str, Split]:
    """split name -> a function reading that split's first N rows, for whatever `task.dataset` names. A path that
    is there but not a file or folder (a symlink loop, a FIFO, a device) is refused with what it is."""
    path = Path(dataset).expanduser()
    kind = path_kind(path, _error)
    if kind == "file":
        return {"train": lambda limit: read_file(path, limit)}
    if kind == "dir":
        if _is_saved_dataset(path):
            return _load_saved(path)
        files = _folder_files(path)
        if not files:
            raise TaskLoadError(
                f"task.dataset {path}: the folder holds no {_KINDS} file and is not a datasets save_to_disk folder"
            )
        return {split: (lambda limit, ps=ps: _read_files(ps, limit)) for split, ps in files.items()}
    if _looks_like_path(dataset):
        raise TaskLoadError(f"task.dataset {dataset}: no such file or folder")
    return _load_cached(dataset, cache_dir)


# -------------------------------------------------------------------------------------------------------- prompts


def template_fields(template: str, where: str, columns: list[str]) -> list[str]:
    """The columns a prompt template names; TaskLoadError for a bad template or a column that is not there."""
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as e:
        raise TaskLoadError(f"task.prompt_template: {e}; write a literal brace doubled ({{{{ or }}}})") from None
    for f in fields:
        if not f.isidentifier():
            raise TaskLoadError(
                f"task.prompt_template: {{{f}}} is not a column name (a template names columns as "
                "{question}; a literal brace is doubled: \\boxed{{}})"
            )
        if f not in columns:
            raise TaskLoadError(
                f"task.prompt_template names the column {f!r}, which {where} does not have; its "
                f"columns: {', '.join(columns)}"
            )
    return fields


def _is_chat(value: Any) -> TypeGuard[list[dict[str, str]]]:
    return (
        isinstance(value, list)
        and bool(value)
        and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in value
        )
    )


def _prompt_value(row: dict[str, Any], i: int, tc: TaskConfig, where: str) -> str | list[dict[str, str]]:
    if tc.prompt_template is not None:
        return tc.prompt_template.format(**row)
    value = row.get(tc.prompt_column)
    if isinstance(value, str) or _is_chat(value):
        return value
    kind = (
        "a list that is not chat messages ({role, content} objects)"
        if isinstance(value, list)
        else f"a {type(value).__name__}"
    )
    raise TaskLoadError(
        f"task.dataset {where}: row {i}'s {tc.prompt_column!r} is {kind}; a prompt is a string or "
        "a list of chat messages: pick another task.prompt_column, or build the prompt with "
        "task.prompt_template, e.g. 'Solve: {" + tc.prompt_column + "}'"
    )


def make_prompt(row: dict[str, Any], i: int, tc: TaskConfig, where: str) -> str | list[dict[str, str]]:
    """The row's prompt: the column or the template, as chat when asked (task.chat, task.system_prompt)."""
    prompt = _prompt_value(row, i, tc, where)
    if isinstance(prompt, str) and (tc.chat or tc.system_prompt is not None):
        prompt = [{"role": "user", "content": prompt}]
    if tc.system_prompt is not None and isinstance(prompt, list) and prompt[0]["role"] != "system":
        prompt = [{"role": "system", "content": tc.system_prompt}, *prompt]  # a row's own system message wins
    return prompt


def _check_prompt_columns(tc: TaskConfig, columns: list[str], where: str) -> None:
    if tc.prompt_template is not None:
        template_fields(tc.prompt_template, where, columns)
    elif tc.prompt_column not in columns:
        raise TaskLoadError(
            f"task.dataset {where} has no column {tc.prompt_column!r} (task.prompt_column); its "
            f"columns: {', '.join(columns)}; set task.prompt_column to one of them, or "
            "task.prompt_template, e.g. 'Solve: {" + columns[0] + "}'"
        )


# ---------------------------------------------------------------------------------------------------- the task


def _split_rows(splits: dict[str, Split], split: str, key: str, where: str, max_rows: int | None) -> Rows:
    if split not in splits:
        raise TaskLoadError(f"task.dataset {where} has no split {split!r} ({key}); its splits: {', '.join(splits)}")
    rows = splits[split](max_rows)
    if not rows:
        raise TaskLoadError(f"task.dataset {where}: the {split!r} split is empty")
    return rows


def _rows_with_prompts(rows: Rows, tc: TaskConfig, where: str) -> Rows:
    return [{**r, "prompt": make_prompt(r, i, tc, where)} for i, r in enumerate(rows)]


def load_dataset_task(tc: TaskConfig, seed: int = 0, cache_dir: str | None = None) -> Task:
    """The task `tc.dataset` describes: its rows with prompts, held-out rows, and the rubric of `tc.rewards`."""
    assert tc.dataset is not None
    where = tc.dataset
    if not tc.rewards:
        raise TaskLoadError(
            f"task.dataset {where} has no reward: name one, e.g. task.rewards=[{{fn: math}}] "
            "(answer_column: answer by default; docs/datasets.md lists them)"
        )
    splits = dataset_splits(tc.dataset, cache_dir)
    train = _split_rows(splits, tc.split, "task.split", where, tc.max_rows)
    if tc.eval_split is not None:
        evals = _split_rows(splits, tc.eval_split, "task.eval_split", where, tc.max_rows)
    else:
        train, evals = hold_out(train, tc.eval_fraction, seed)
    cols = columns(train + evals)
    _check_prompt_columns(tc, cols, where)
    try:
        rubric = rubric_from_specs(tc.rewards, tc.answer_format)
        check_columns(rubric, [*cols, "prompt"])
    except RewardConfigError as e:
        raise TaskLoadError(f"task.dataset {where}: {e}") from None
    return Task(
        name=f"dataset:{tc.label}",
        train_rows=_rows_with_prompts(train, tc, where),
        eval_rows=_rows_with_prompts(evals, tc, where),
        rubric=rubric,
        description=f"rows of {where}, rewards {', '.join(c.name for c in rubric.components)}",
    )
