"""A verifiers taskset without `eval` options holds out the same rows as every other loader (tasks/load.py
`to_task`): the same `rows.hold_out`, so the same split for the same rows and seed."""

from __future__ import annotations

import pytest

vf = pytest.importorskip("verifiers.v1")

from posttrain.tasks.load import load_task, to_task  # noqa: E402 - after the optional dependency's check


class NumberSetConfig(vf.TasksetConfig):
    n: int = 3


class NumberSet(vf.Taskset[vf.Task, NumberSetConfig]):
    def load(self):
        for i in range(self.config.n):
            yield vf.Task(vf.TaskData(prompt=str(i)), self.config.task)


def load_numbers(n: int = 3):
    return NumberSet(NumberSetConfig(n=n))


@pytest.mark.parametrize("n", [1, 2, 10, 150])
def test_a_verifiers_taskset_holds_out_what_to_task_holds_out(n):
    seed = 3
    task = load_task(f"verifiers:{__file__}:load_numbers", {"n": n}, seed)
    got = [int(r["prompt"]) for r in task.train_rows], [int(r["prompt"]) for r in task.eval_rows]
    rows = [{"prompt": str(i)} for i in range(n)]
    plain = to_task({"train": rows, "rewards": [lambda completions, **kw: [0.0] * len(completions)]}, "t", seed)
    assert got == ([int(r["prompt"]) for r in plain.train_rows], [int(r["prompt"]) for r in plain.eval_rows])

