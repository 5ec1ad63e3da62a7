"""Hostile data files for `task.dataset` (tasks/dataset.py, read through rewards/rows_file.py): every file is read
within caps (bytes, one line, nesting), line by line, and every problem is one TaskLoadError line naming the file
and the line or row, with the real reason a path cannot be read (a symlink loop, a FIFO, a device).

The caps are lowered with monkeypatch where a test would otherwise need a file of their size."""

from __future__ import annotations

import json
import os
import threading
import tracemalloc
from pathlib import Path

import pytest

from posttrain.config import load_config
from posttrain.envs.task import TaskLoadError
from posttrain.errors import PosttrainError
from posttrain.rewards import rows_file
from posttrain.tasks.from_config import task_from_config

MATH = "task.rewards=[{fn: math}]"
ROWS = [{"prompt": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(20)]


def _caps(monkeypatch, **caps: int) -> None:
    """rows_file's caps lowered for this test (a Limits with these fields)."""
    limits = getattr(rows_file, "Limits", None)
    monkeypatch.setattr(rows_file, "LIMITS", limits(**caps) if limits else None, raising=False)


def _task(path, *over: str):
    return task_from_config(load_config(None, [f"task.dataset={path}", MATH, *over]).task)


def _error(path, *over: str) -> str:
    with pytest.raises(TaskLoadError) as e:
        _task(path, *over)
    msg = str(e.value)
    assert "\n" not in msg and isinstance(e.value, PosttrainError)  # the CLI prints it as one line, no traceback
    return msg


def _jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _peak_bytes(fn) -> int:
    """The most memory Python allocated while fn() ran (tracemalloc)."""
    tracemalloc.start()
    try:
        fn()
    except Exception:  # noqa: BLE001 - the caller checks the error itself; here only the memory counts
        pass
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return peak


# ------------------------------------------------------------------------------------------------ size caps


def test_a_line_over_the_line_cap_is_refused_with_its_line_number(tmp_path, monkeypatch):
    _caps(monkeypatch, line_bytes=64 << 10)
    p = _jsonl(tmp_path / "big.jsonl", [*ROWS[:2], {"prompt": "x" * (300 << 10), "answer": "1"}, *ROWS[2:]])
    msg = _error(p)
    assert msg.startswith(f"task.dataset {p}:3: a line longer than 65,536 bytes"), msg
    assert _peak_bytes(lambda: _task(p)) < 1 << 20  # never more than about one capped line in memory


def test_a_file_with_no_newline_is_read_one_capped_line_at_most(tmp_path, monkeypatch):
    _caps(monkeypatch, line_bytes=64 << 10)
    p = tmp_path / "one-line.jsonl"
    p.write_bytes(b'{"prompt": "' + b"a" * (4 << 20))  # 4 MB, no newline: never read whole
    assert _error(p).startswith(f"task.dataset {p}:1: a line longer than 65,536 bytes")
    assert _peak_bytes(lambda: _task(p)) < 1 << 20


def test_a_sparse_8_gib_file_without_a_newline_at_the_default_caps(tmp_path):
    """The file a tester made: 8 GiB and no newline (sparse here: it takes no disk). Refused after one capped read."""
    p = tmp_path / "huge.jsonl"
    with p.open("wb") as f:
        f.truncate(8 << 30)
    assert _error(p).startswith(f"task.dataset {p}:1: a line longer than")
    assert _peak_bytes(lambda: _task(p)) < 100 << 20


def test_a_file_over_the_data_cap_is_refused_and_max_rows_reads_only_what_it_needs(tmp_path, monkeypatch):
    _caps(monkeypatch, data_bytes=16 << 10)
    rows = [{"prompt": f"question {i} " + "x" * 100, "answer": "1"} for i in range(400)]  # ~50 KB
    p = _jsonl(tmp_path / "many.jsonl", rows)
    msg = _error(p)
    assert msg.startswith(f"task.dataset {p}:") and "more than 16,384 bytes" in msg, msg
    task = _task(p, "task.max_rows=20")  # the first 20 rows fit the cap: the rest is never read
    assert len(task.train_rows) + len(task.eval_rows) == 20


def test_a_parquet_file_over_the_data_cap_is_refused(tmp_path, monkeypatch):
    import pyarrow as pa
    import pyarrow.parquet as pq

    _caps(monkeypatch, data_bytes=16 << 10)
    p = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist([{"prompt": "y" * 1000, "answer": "1"}] * 100), p)  # compresses to little
    msg = _error(p)
    assert msg.startswith(f"task.dataset {p}:") and "more than 16,384 bytes" in msg, msg


# -------------------------------------------------------------------------------------------- what a parser hits


def test_a_csv_field_over_the_csv_limit_is_one_line(tmp_path):
    p = tmp_path / "long.csv"
    p.write_text("prompt,answer\nshort,1\n" + "z" * 131_073 + ",2\n")
    msg = _error(p)
    assert msg.startswith(f"task.dataset {p}:3: ") and "field larger than field limit (131072)" in msg, msg


def test_a_csv_row_with_more_fields_than_its_header(tmp_path):
    p = tmp_path / "wide.csv"
    p.write_text("prompt,answer\na,1\nb,2,extra\n")
    assert _error(p) == f"task.dataset {p}:3: 3 fields, the header has 2 (prompt, answer)"


@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_a_prompt_nested_100000_deep(tmp_path, suffix):
    nested = '{"prompt": ' + "[" * 100_000 + "]" * 100_000 + ', "answer": "1"}'
    p = tmp_path / f"deep{suffix}"
    p.write_text(nested + "\n" if suffix == ".jsonl" else f"[{nested}]")
    msg = _error(p)
    assert msg.startswith(f"task.dataset {p}") and "nested deeper than" in msg, msg


def test_a_line_that_is_not_utf8_names_its_line(tmp_path):
    p = tmp_path / "latin.jsonl"
    p.write_bytes(b'{"prompt": "a", "answer": "1"}\n{"prompt": "caf\xe9", "answer": "1"}\n')
    assert _error(p).startswith(f"task.dataset {p}:2: not UTF-8 text")


# -------------------------------------------------------------------------- paths that are not regular files


def test_a_symlink_loop_says_so(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.symlink_to(b)
    b.symlink_to(a)
    assert _error(a) == f"task.dataset {a}: a symlink loop (too many levels of symbolic links)"


def test_a_dangling_symlink_names_its_target(tmp_path):
    link = tmp_path / "data.jsonl"
    link.symlink_to(tmp_path / "gone.jsonl")
    assert _error(link) == f"task.dataset {link}: a symlink to {tmp_path / 'gone.jsonl'}, which does not exist"


@pytest.mark.timeout(30)
def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    with _unblocker(fifo):
        assert _error(fifo) == f"task.dataset {fifo}: a FIFO (named pipe), not a regular file or folder"
    folder = tmp_path / "data"
    folder.mkdir()
    _jsonl(folder / "test.jsonl", ROWS)
    os.mkfifo(folder / "train.jsonl")  # inside a folder: reported, never skipped in silence nor read
    with _unblocker(folder / "train.jsonl"):
        assert _error(folder) == f"task.dataset {folder / 'train.jsonl'}: a FIFO (named pipe), not a regular file"


def test_a_device_is_refused_without_reading_it():
    assert _error("/dev/zero") == "task.dataset /dev/zero: a character device, not a regular file or folder"


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_a_file_without_read_permission_says_so(tmp_path):
    p = _jsonl(tmp_path / "secret.jsonl", ROWS)
    p.chmod(0)
    assert _error(p) == f"task.dataset {p}: permission denied"


class _unblocker:
    """While the block runs, a thread opens `fifo` for writing whenever a reader is waiting (then closes it), so a
    reader that blocks on the FIFO gets end-of-file instead of hanging the test; it never blocks itself."""

    def __init__(self, fifo: Path):
        self.fifo, self.stop = fifo, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(0.05):
            try:
                os.close(os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:  # ENXIO: no reader yet
                pass

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(5)


# ------------------------------------------------------------------------------------------- folders and datasets


def test_a_folder_past_its_entry_cap_is_refused(tmp_path, monkeypatch):
    from posttrain.tasks import dataset

    monkeypatch.setattr(dataset, "MAX_FOLDER_ENTRIES", 5, raising=False)
    for i in range(8):
        (tmp_path / f"notes{i}.txt").write_text("x")
    _jsonl(tmp_path / "train.jsonl", ROWS)
    assert _error(tmp_path) == (f"task.dataset {tmp_path}: the folder holds more than 5 files; point task.dataset at "
                                "the folder of the data files")


def test_a_saved_dataset_over_the_data_cap_unless_max_rows(tmp_path, monkeypatch):
    from datasets import Dataset

    Dataset.from_list([{"prompt": "p" * 500, "answer": "1"}] * 200).save_to_disk(str(tmp_path / "saved"))
    _caps(monkeypatch, data_bytes=16 << 10)
    msg = _error(tmp_path / "saved")
    assert msg.startswith(f"task.dataset {tmp_path / 'saved'}: 200 rows take ") and "set task.max_rows" in msg, msg
    task = _task(tmp_path / "saved", "task.max_rows=10")
    assert len(task.train_rows) + len(task.eval_rows) == 10
