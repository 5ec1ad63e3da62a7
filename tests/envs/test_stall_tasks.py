"""The tasks built to stall (examples/stall_tasks.py) load as custom tasks and score as their docstrings say."""

import hashlib
from pathlib import Path

import pytest

from posttrain.tasks.load import load_task

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "stall_tasks.py"


def score(task, row, text):
    comp = task.rubric.components[0]
    return comp.func([[{"role": "assistant", "content": text}]], **{k: [v] for k, v in row.items()})[0]


@pytest.mark.parametrize("name", ["partial_credit", "never_pass", "truncated"])
def test_loads_with_train_and_eval_rows(name):
    task = load_task(f"{EXAMPLES}:{name}")
    assert task.train_rows and task.eval_rows and task.max_tokens


def test_partial_credit_pays_0_3_for_a_sentence_and_1_for_the_word():
    task = load_task(f"{EXAMPLES}:partial_credit")
    row = task.train_rows[0]
    lab = row["label"]
    other = "negative" if lab == "positive" else "positive"
    assert score(task, row, lab) == 1.0 and score(task, row, f" {lab.capitalize()}.") == 1.0
    assert score(task, row, f"The sentiment of this review is {lab}") == 0.3
    assert score(task, row, f"It is {lab}, not {other}") == 0.0 and score(task, row, other) == 0.0
    assert "format_hint" in row and task.stop == ["."]


def test_never_pass_needs_the_real_hash_and_shapes_on_format():
    task = load_task(f"{EXAMPLES}:never_pass")
    row = task.train_rows[0]
    right = hashlib.sha256(row["word"].encode()).hexdigest()[:6]
    wrong = "000000" if right != "000000" else "111111"
    assert score(task, row, right) == 1.0 and score(task, row, wrong) == 0.0
    shaping = task.rubric.components[1].func
    assert shaping([f"{wrong} is it"]) == [1.0] and shaping(["no idea"]) == [0.0], \
        "any 6 hex digits earn the shaping reward"


def test_truncated_needs_more_tokens_than_it_gets():
    task = load_task(f"{EXAMPLES}:truncated")
    row = task.train_rows[0]
    full = ", ".join(str(i) for i in range(1, row["upto"] + 1))
    assert score(task, row, full) == 1.0 and score(task, row, "1, 2, 3") == pytest.approx(3 / row["upto"])
    assert len(full) / 4 > task.max_tokens  # even at 4 characters a token the full list does not fit
