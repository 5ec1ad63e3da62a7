"""task.subset: keep only the listed rows of a task (bench/feedback.py writes one), through the real builder; every
bad file is refused with a message that names the problem."""

import json

import pytest

from posttrain.config import load_config
from posttrain.envs.task import TaskLoadError
from posttrain.tasks.load import apply_subset, load_task
from posttrain.loop.components import build


def _write(tmp_path, spec):
    p = tmp_path / "subset.json"
    p.write_text(spec if isinstance(spec, str) else json.dumps(spec))
    return p


def test_subset_keeps_the_listed_rows_in_order(tmp_path):
    task = load_task("count-a")
    train, evals = list(task.train_rows), list(task.eval_rows)
    sub = apply_subset(load_task("count-a"), str(_write(tmp_path, {"train": [5, 2], "eval": [0]})))
    assert sub.train_rows == [train[5], train[2]] and sub.eval_rows == [evals[0]]
    only_train = apply_subset(load_task("count-a"), str(_write(tmp_path, {"train": [1]})))
    assert only_train.eval_rows == evals  # a split the file leaves out is kept whole


def test_the_builder_applies_it(tmp_path):
    p = _write(tmp_path, {"train": [3], "eval": [1, 2]})
    c = build(load_config(None, ["model.name=tiny-random", "task.name=count-a", f"task.subset={p}"]),
              log=lambda *a: None)
    assert len(c.task.train_rows) == 1 and len(c.task.eval_rows) == 2


@pytest.mark.parametrize("spec,match", [
    ("not json", "cannot read"), ([1, 2], "must be an object"), ({"other": []}, "must be an object"),
    ({"train": [0, 999]}, "out of range"), ({"train": []}, "train list is empty"), ({"train": ["a"]}, "row indices"),
    ({"train": [True]}, "row indices"), ({"eval": [-1]}, "out of range"),
])
def test_bad_subset_files_are_refused(tmp_path, spec, match):
    with pytest.raises(TaskLoadError, match=match):
        apply_subset(load_task("count-a"), str(_write(tmp_path, spec)))


def test_missing_subset_file(tmp_path):
    with pytest.raises(TaskLoadError, match="cannot read"):
        apply_subset(load_task("count-a"), str(tmp_path / "nope.json"))
