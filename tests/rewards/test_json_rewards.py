"""The generic JSON reward functions and the JSON rubric."""

from __future__ import annotations

import pytest

from posttrain.rewards.json_rewards import (
    DEFAULT_WEIGHTS,
    MISSING,
    json_exact,
    json_parse,
    json_rubric,
    json_schema,
    json_values,
    leaf_paths,
    parse_json_completion,
    strict_equal,
)

PERSON_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "city": {"type": "string"}},
    "required": ["name", "age", "city"],
}
PERSON = {"name": "Ana Lund", "age": 31, "city": "Oslo"}
ORDER_SCHEMA = {
    "type": "object",
    "properties": {"customer": {"type": "string"},
                   "items": {"type": "array", "items": {"type": "object", "properties": {
                       "name": {"type": "string"}, "qty": {"type": "integer"}}, "required": ["name", "qty"]}}},
    "required": ["customer", "items"],
}
ORDER = {"customer": "Ana Lund", "items": [{"name": "mug", "qty": 2}, {"name": "pen", "qty": 1}]}


def chat(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


BARE = '{"name": "Ana Lund", "age": 31, "city": "Oslo"}'


@pytest.mark.parametrize("text, score", [
    (BARE, 1.0),
    ("  \n" + BARE + "\n ", 1.0),
    ("```json\n" + BARE + "\n```", 1.0),
    ("```\n" + BARE + "\n```", 1.0),
    ("```json\n" + BARE, 1.0),  # generation stopped before the closing fence
    ("Here is the JSON:\n" + BARE, 0.5),
    (BARE + "\nHope this helps!", 0.5),
    ("Sure:\n```json\n" + BARE + "\n```\nDone.", 0.5),
    (BARE + "\n" + BARE, 0.5),
    ("[1, 2] trailing", 0.5),
    ("Some [note] then " + BARE, 0.5),  # the first `[` does not decode, the first `{` does
    ('{"name": "Ana", "age": 31,', 0.0),
    ("{'name': 'Ana'}", 0.0),
    ("no json here", 0.0),
    ("", 0.0),
    ('{"x": NaN}', 0.0),
])
def test_json_parse(text: str, score: float) -> None:
    assert json_parse([text]) == [score]
    assert json_parse([chat(text)]) == [score]


def test_parse_value_and_null() -> None:
    assert parse_json_completion("null") == (None, 1.0)
    assert parse_json_completion("nope") == (MISSING, 0.0)
    assert parse_json_completion("x " + BARE)[0] == PERSON


def test_strict_equal() -> None:
    assert strict_equal(1, 1) and not strict_equal(1, 1.0) and not strict_equal(1, True)
    assert not strict_equal(True, 1) and strict_equal(True, True)
    assert strict_equal(12.0, 12) and strict_equal(12.5, 12.5) and not strict_equal(12.5, "12.5")
    assert not strict_equal(1.0, True)
    assert strict_equal(None, None) and not strict_equal(None, 0)
    assert strict_equal(ORDER, {"items": [{"qty": 2, "name": "mug"}, {"name": "pen", "qty": 1}], "customer": "Ana Lund"})
    assert not strict_equal(ORDER, {**ORDER, "extra": 1})
    assert not strict_equal([1, 2], [2, 1]) and not strict_equal([1], [1, 1])


def test_leaf_paths() -> None:
    assert leaf_paths(ORDER) == [(("customer",), "Ana Lund"), (("items", 0, "name"), "mug"), (("items", 0, "qty"), 2),
                                 (("items", 1, "name"), "pen"), (("items", 1, "qty"), 1)]
    assert leaf_paths({"tags": []}) == [(("tags",), [])]


def test_json_schema() -> None:
    texts = [BARE, '{"name": "Ana Lund", "age": "31", "city": "Oslo"}', '{"name": "Ana Lund", "city": "Oslo"}',
             "oops", "Answer: " + BARE, '{"name": "Ana Lund", "age": 31.5, "city": "Oslo"}']
    assert json_schema(texts, schema=[PERSON_SCHEMA] * len(texts)) == [1.0, 0.0, 0.0, 0.0, 1.0, 0.0]
    assert json_schema([BARE], schema=[None]) == [None]  # no schema: does not apply
    assert json_schema([BARE]) == [None]


def test_json_values_fraction() -> None:
    texts = [
        BARE,
        '{"name": "Ana Lund", "age": "31", "city": "Oslo"}',  # wrong type for age
        '{"name": "Ana Lund", "age": 31.0, "city": "Bergen"}',  # 31.0 is not the integer 31
        '{"name": "Ana Lund", "age": 31, "city": "Oslo", "extra": true}',  # extras cost nothing
        "{}",
        "not json",
    ]
    assert json_values(texts, expected=[PERSON] * len(texts)) == pytest.approx([1.0, 2 / 3, 1 / 3, 1.0, 0.0, 0.0])
    got = '{"customer": "Ana Lund", "items": [{"name": "mug", "qty": 2}, {"name": "cup", "qty": true}]}'
    assert json_values([got], expected=[ORDER]) == pytest.approx([3 / 5])
    assert json_values(['{"ok": true}'], expected=[{"ok": 1}]) == [0.0]  # bool never equals int
    assert json_values(['{"ok": 1}'], expected=[{"ok": True}]) == [0.0]


def test_json_exact() -> None:
    texts = [BARE, "```json\n" + BARE + "\n```", "Answer: " + BARE, '{"name": "Ana Lund", "age": 31, "city": "Oslo", "x": 1}',
             '{"name": "Ana Lund", "age": "31", "city": "Oslo"}', '{"name": "Ana Lund", "age": 31.0, "city": "Oslo"}']
    n = len(texts)
    assert json_exact(texts, schema=[PERSON_SCHEMA] * n, expected=[PERSON] * n) == [1.0, 1.0, 0.5, 0.0, 0.0, 0.0]
    # an expected value that does not validate never passes
    assert json_exact(['{"name": 3}'], schema=[PERSON_SCHEMA], expected=[{"name": 3}]) == [0.0]
    assert json_exact(['[{"name": "mug", "qty": 2}]'], expected=[[{"name": "mug", "qty": 2}]]) == [1.0]


def test_rubric_scores_and_passes() -> None:
    rubric = json_rubric()
    assert [c.name for c in rubric.components] == list(DEFAULT_WEIGHTS)
    assert rubric.pass_component == "json_exact"
    rows = [{"prompt": [{"role": "user", "content": "q"}], "schema": ORDER_SCHEMA, "expected": ORDER}] * 5
    completions = [
        chat('{"customer": "Ana Lund", "items": [{"name": "mug", "qty": 2}, {"name": "pen", "qty": 1}]}'),
        chat('Here: {"customer": "Ana Lund", "items": [{"name": "mug", "qty": 2}, {"name": "pen", "qty": 1}]}'),
        chat('{"customer": "Ana Lund", "items": [{"name": "mug", "qty": 2}, {"name": "pen", "qty": "1"}]}'),
        chat('{"customer": "Ana Lund", "items": [{"name": "mug", "qty": 2}]}'),
        chat("I cannot do that."),
    ]
    scores = rubric.score(completions, rows)
    w = DEFAULT_WEIGHTS
    p, sc, v, e = w["json_parse"], w["json_schema"], w["json_values"], w["json_exact"]
    assert [s.reward for s in scores] == pytest.approx([p + sc + v + e, 0.5 * p + sc + v + 0.5 * e, p + v * 0.8,
                                                        p + sc + v * 0.6, 0.0])
    assert [s.passed for s in scores] == [True, True, False, False, False]
    assert scores[1].components == {"json_parse": 0.5, "json_schema": 1.0, "json_values": 1.0, "json_exact": 0.5}
    assert rubric.passes("json_parse", 0.5) and not rubric.passes("json_values", 0.99)
    assert not any(s.failed for s in scores)


def test_rubric_weights() -> None:
    rubric = json_rubric({"json_exact": 3.0, "json_parse": 0})
    assert {c.name: c.weight for c in rubric.components} == {**DEFAULT_WEIGHTS, "json_exact": 3.0, "json_parse": 0.0}
    rows = [{"prompt": "q", "schema": PERSON_SCHEMA, "expected": PERSON}]
    expected = DEFAULT_WEIGHTS["json_schema"] + DEFAULT_WEIGHTS["json_values"] + 3.0
    assert rubric.score([BARE], rows)[0].reward == pytest.approx(expected)
    with pytest.raises(ValueError, match="json_exact"):
        json_rubric({"exact": 1.0})
