"""The files tasks/load.py reads besides a dataset: a `task.subset` file and a task file (`task.name=FILE.py:fn`,
imported by tasks/user_files.py). A FIFO, a symlink loop or an oversized file is refused in one line, never read
until it blocks or fills memory."""

from __future__ import annotations

import json
import os

import pytest

from posttrain.envs.task import TaskLoadError
from posttrain.rewards import rows_file
from posttrain.tasks.load import apply_subset, load_task


def _message(fn) -> str:
    with pytest.raises(TaskLoadError) as e:
        fn()
    assert "\n" not in str(e.value)
    return str(e.value)


@pytest.mark.timeout(30)
def test_a_subset_file_that_is_a_fifo_or_a_loop(tmp_path):
    fifo = tmp_path / "subset.json"
    os.mkfifo(fifo)
    assert _message(lambda: apply_subset(load_task("count-a"), str(fifo))) == (
        f"task.subset: cannot read {fifo}: a FIFO (named pipe), not a regular file")
    loop = tmp_path / "loop.json"
    loop.symlink_to(loop)
    assert "a symlink loop" in _message(lambda: apply_subset(load_task("count-a"), str(loop)))


def test_a_subset_file_over_the_cap_or_too_deep(tmp_path, monkeypatch):
    p = tmp_path / "subset.json"
    p.write_text('{"train": ' + "[" * 100_000 + "]" * 100_000 + "}")
    assert "nested deeper than" in _message(lambda: apply_subset(load_task("count-a"), str(p)))
    limits = getattr(rows_file, "Limits", None)
    monkeypatch.setattr(rows_file, "LIMITS", limits(json_bytes=100) if limits else None, raising=False)
    p.write_text(json.dumps({"train": list(range(50))}))
    assert "more than 100 bytes" in _message(lambda: apply_subset(load_task("count-a"), str(p)))


@pytest.mark.timeout(30)
def test_a_task_file_that_is_a_fifo_a_loop_or_a_folder(tmp_path):
    fifo = tmp_path / "task.py"
    os.mkfifo(fifo)
    assert _message(lambda: load_task(f"{fifo}:make_task")) == (
        f"task file {fifo}: a FIFO (named pipe), not a regular file")
    loop = tmp_path / "loop.py"
    loop.symlink_to(loop)
    assert _message(lambda: load_task(f"{loop}:make_task")) == (
        f"task file {loop}: a symlink loop (too many levels of symbolic links)")
    (tmp_path / "pkg.py").mkdir()
    assert _message(lambda: load_task(f"{tmp_path / 'pkg.py'}:make_task")) == (
        f"task file {tmp_path / 'pkg.py'}: a folder, not a regular file")
    assert _message(lambda: load_task(f"{tmp_path / 'none.py'}:make_task")) == (
        f"task file not found: {tmp_path / 'none.py'}")
