"""The built-in `json-extract` task."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from jsonschema import Draft202012Validator

from posttrain.envs.task import Task
from posttrain.tasks import builtin_task_factory
from posttrain.tasks.json_extract import SHAPES, make_task, skeleton


@pytest.fixture(scope="module")
def task() -> Task:
    return make_task(seed=0)


def test_shape_of_task(task: Task) -> None:
    assert task.name == "json-extract"
    assert task.conversational
    assert task.max_tokens == 96
    assert len(task.train_rows) == 400 and len(task.eval_rows) == 48
    assert builtin_task_factory("json-extract") is make_task
    for row in task.train_rows[:20] + task.eval_rows:
        assert set(row) == {"prompt", "schema", "expected", "shape", "entity"}
        system, user = row["prompt"]
        assert system["role"] == "system" and user["role"] == "user"
        assert json.dumps(skeleton(row["schema"]), separators=(",", ":")) in user["content"]
        assert "only the JSON" in user["content"]


def test_deterministic_by_seed() -> None:
    a, b, c = make_task(seed=3, n_train=60, n_eval=12), make_task(seed=3, n_train=60, n_eval=12), make_task(seed=4, n_train=60, n_eval=12)
    assert a.train_rows == b.train_rows and a.eval_rows == b.eval_rows
    assert a.train_rows != c.train_rows and a.eval_rows != c.eval_rows
    # the held-out rows do not depend on how many training rows were asked for
    assert make_task(seed=3, n_train=10, n_eval=12).eval_rows == a.eval_rows


def test_shapes_balanced(task: Task) -> None:
    assert len(SHAPES) >= 5
    for rows in (task.train_rows, task.eval_rows):
        counts = Counter(r["shape"] for r in rows)
        assert set(counts) == set(SHAPES)
        assert max(counts.values()) - min(counts.values()) <= 1
    kinds = {json.dumps(r["schema"]) for r in task.train_rows}
    assert any('"type": "array", "items": {"type": "object"' in k for k in kinds)  # arrays of objects
    assert any(r["schema"]["type"] == "array" for r in task.train_rows)  # a top-level array
    assert any(isinstance(v, dict) for r in task.train_rows if isinstance(r["expected"], dict)
               for v in r["expected"].values())  # a nested object


def test_entity_split_disjoint(task: Task) -> None:
    train = {r["entity"] for r in task.train_rows}
    held = {r["entity"] for r in task.eval_rows}
    assert train and held and not train & held
    big = make_task(seed=1, n_train=2000, n_eval=500)
    assert not {r["entity"] for r in big.train_rows} & {r["entity"] for r in big.eval_rows}


def test_expected_validates_and_scores_full(task: Task) -> None:
    rows = task.train_rows + task.eval_rows
    for row in rows:
        Draft202012Validator.check_schema(row["schema"])
        assert Draft202012Validator(row["schema"]).is_valid(row["expected"]), row
        assert row["entity"] in json.dumps(row["expected"]) or "+" in row["entity"]
    # the expected JSON itself, as a chat completion, gets every component and the pass
    completions = [[{"role": "assistant", "content": json.dumps(r["expected"])}] for r in rows]
    scores = task.rubric.score(completions, rows)
    assert all(s.passed and s.reward == pytest.approx(2.0) for s in scores)


def test_demonstrations_pass_and_hold_no_eval_entity(task: Task) -> None:
    # the warm start trains on these: each must earn the full reward, as one single-line reply, and none may
    # leak a held-out entity
    assert task.demonstrate is not None
    replies = [task.demonstrate(r) for r in task.train_rows]
    assert all(len(r) == 1 and "\n" not in r[0] for r in replies)
    completions = [[{"role": "assistant", "content": r[0]}] for r in replies]
    scores = task.rubric.score(completions, task.train_rows)
    assert all(s.passed and s.reward == pytest.approx(2.0) for s in scores)
    held_out = {r["entity"] for r in task.eval_rows}
    assert not any(e in r[0] for r in replies for e in held_out)


def test_values_are_in_the_prompt(task: Task) -> None:
    """Every expected string and number is copyable from the user message (booleans are worded)."""
    for row in task.eval_rows:
        user = row["prompt"][1]["content"]
        stack = [row["expected"]]
        while stack:
            v = stack.pop()
            if isinstance(v, dict):
                stack.extend(v.values())
            elif isinstance(v, list):
                stack.extend(v)
            elif not isinstance(v, bool):
                assert str(v) in user, (v, user)


def test_prompts_short(task: Task) -> None:
    longest = max(len(r["prompt"][0]["content"]) + len(r["prompt"][1]["content"]) for r in task.train_rows)
    assert longest < 300  # characters; about 60-80 tokens with the chat template


def test_weights_and_options() -> None:
    t = make_task(n_train=6, n_eval=0, weights={"json_exact": 2.0})
    assert {c.name: c.weight for c in t.rubric.components}["json_exact"] == 2.0
    with pytest.raises(ValueError, match="valid"):
        make_task(n_train=6, weights={"bogus": 1.0})
    full = make_task(n_train=6, n_eval=0, schema_style="jsonschema")
    row = full.train_rows[0]
    assert json.dumps(row["schema"], separators=(",", ":")) in row["prompt"][1]["content"]
    with pytest.raises(ValueError):
        make_task(schema_style="yaml")
