"""Every loader that holds rows out for evaluation (tasks/load.py `to_task`, tasks/dataset.py `task.dataset`,
tasks/verifiers_task.py) draws the same split from the same rows and seed: one function, `rows.hold_out`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from posttrain.config import load_config
from posttrain.tasks.dataset import load_dataset_task
from posttrain.tasks.load import to_task

SIZES = [1, 2, 10, 150, 1000]


def ids(rows: list[dict]) -> list[int]:
    return [int(r["answer"]) for r in rows]


def rows_of(n: int) -> list[dict]:
    return [{"prompt": f"q{i}", "answer": str(i)} for i in range(n)]


def from_to_task(n: int, seed: int) -> tuple[list[int], list[int]]:
    task = to_task({"train": rows_of(n), "rewards": [lambda completions, **kw: [0.0] * len(completions)]}, "t", seed)
    return ids(task.train_rows), ids(task.eval_rows)


def from_dataset(tmp_path: Path, n: int, seed: int) -> tuple[list[int], list[int]]:
    path = tmp_path / f"rows{n}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows_of(n)))
    tc = load_config(None, [f"task.dataset={path}", "task.rewards=[{fn: exact}]"]).task
    task = load_dataset_task(tc, seed)
    return ids(task.train_rows), ids(task.eval_rows)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("seed", [0, 7])
def test_to_task_and_task_dataset_hold_out_the_same_rows(tmp_path, n, seed):
    train, evals = from_to_task(n, seed)
    assert from_dataset(tmp_path, n, seed) == (train, evals)
    assert sorted(train + evals) == list(range(n))
    assert len(evals) == (0 if n < 2 else min(64, max(1, n // 10)))
