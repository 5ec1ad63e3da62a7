"""Generic JSON reward functions (TRL signature) and a rubric built from them.

Each function takes `completions` (strings or `[{"role": "assistant", "content": ...}]` lists) and the task
columns as keyword lists, and returns one float in [0, 1] per completion (`None` where a needed column is
missing for that row, i.e. "does not apply"):

- `json_parse`: does the completion contain JSON, and is it only JSON (see `parse_json_completion`).
- `json_schema`: does the parsed value validate against the row's `schema` (JSON Schema Draft 2020-12).
- `json_values`: fraction of the `expected` leaf values found, at the same path, in the parsed value.
- `json_exact`: the parsed value validates and equals `expected` exactly (strict JSON typing).

Strict typing (`strict_equal`): strings, booleans, null, objects and arrays compare as JSON; `true` never
equals `1`; an expected integer needs an integer (`1.0` does not match `1`); an expected float accepts
any number that is numerically equal (`12` matches `12.0`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from jsonschema import Draft202012Validator

from posttrain.bounded import BoundedError, decode_json_prefix, loads_json
from posttrain.rewards.rubric import RewardComponent, Rubric
from posttrain.rewards.text import completion_text

__all__ = [
    "DEFAULT_WEIGHTS",
    "MISSING",
    "json_exact",
    "json_parse",
    "json_rubric",
    "json_schema",
    "json_values",
    "leaf_paths",
    "parse_json_completion",
    "strict_equal",
]


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()  # "no JSON found" (distinct from a parsed `null`)

# The opening of a fenced block, ``` or ```json (any info string): anchored, and its parts share no characters.
_FENCE_OPEN = re.compile(r"\A```[A-Za-z0-9_-]*[ \t]*\n?")


def _fenced_body(text: str) -> str | None:
    """The content of `text` when the whole text is one fenced block (the closing fence may be missing, e.g. when
    generation stopped), else None. What the regex \\A```[A-Za-z0-9_-]*[ \\t]*\\n?(.*?)\\n?[ \\t]*(?:```)?\\Z
    (DOTALL) captures, without its lazy scan, which re-reads every run of spaces to its end (quadratic)."""
    m = _FENCE_OPEN.match(text)
    if m is None:
        return None
    body = text[m.end() :]
    body = body[:-3] if body.endswith("```") else body
    body = body.rstrip(" \t")
    return body[:-1] if body.endswith("\n") else body


def _loads_whole(text: str) -> Any:
    """The JSON value that is exactly `text` (surrounding whitespace allowed), or MISSING. Bounded (size, depth:
    posttrain.bounded): JSON too deep or too large is MISSING, like invalid JSON."""
    try:
        return loads_json(text.strip())
    except BoundedError:
        return MISSING


def parse_json_completion(completion: Any) -> tuple[Any, float]:
    """Find the JSON in a completion. Returns `(value, score)`; `(MISSING, 0.0)` when there is none.

    Rule:
    1. The whole text (whitespace stripped) is one JSON value -> score 1.0.
    2. The whole text is one fenced block, ```json ... ``` or ``` ... ``` (the closing fence may be missing,
       e.g. when generation stopped), whose content is one JSON value -> 1.0.
    3. Otherwise the first complete JSON value in the text, decoded with `json.JSONDecoder().raw_decode`
       from the first `{` or the first `[` (whichever decodes and comes first) -> 0.5, since there is
       other text around it (prose, a fence plus prose, a second value...) and we want only JSON.
    NaN, Infinity and numbers too large for a float (1e999) are not JSON and never parse; nor does JSON nested
    deeper than posttrain.bounded's cap or a text over its size cap.
    """
    text = completion_text(completion).strip()
    value = _loads_whole(text)
    if value is not MISSING:
        return value, 1.0
    body = _fenced_body(text)
    if body is not None:
        value = _loads_whole(body)
        if value is not MISSING:
            return value, 1.0
    starts = sorted(i for i in (text.find("{"), text.find("[")) if i >= 0)
    for start in starts:
        try:
            value, _ = decode_json_prefix(text, start)
        except BoundedError:
            continue
        return value, 0.5
    return MISSING, 0.0


def strict_equal(expected: Any, got: Any) -> bool:
    """JSON equality with strict types (see the module docstring)."""
    if isinstance(expected, bool):
        return isinstance(got, bool) and got == expected
    if isinstance(expected, int):
        return type(got) is int and got == expected
    if isinstance(expected, float):
        return isinstance(got, (int, float)) and not isinstance(got, bool) and got == expected
    if expected is None:
        return got is None
    if isinstance(expected, str):
        return isinstance(got, str) and got == expected
    if isinstance(expected, list):
        return (
            isinstance(got, list)
            and len(got) == len(expected)
            and all(strict_equal(e, g) for e, g in zip(expected, got))
        )
    if isinstance(expected, Mapping):
        return (
            isinstance(got, Mapping)
            and set(got) == set(expected)
            and all(strict_equal(v, got[k]) for k, v in expected.items())
        )
    return bool(expected == got)


def leaf_paths(value: Any, prefix: tuple = ()) -> list[tuple[tuple, Any]]:
    """`(path, leaf)` pairs of a JSON value; a path is a tuple of object keys and array indices.
    Scalars and empty objects/arrays are leaves."""
    if isinstance(value, Mapping) and value:
        return [p for k, v in value.items() for p in leaf_paths(v, prefix + (k,))]
    if isinstance(value, list) and value:
        return [p for i, v in enumerate(value) for p in leaf_paths(v, prefix + (i,))]
    return [(prefix, value)]


def _lookup(value: Any, path: tuple) -> Any:
    for step in path:
        if isinstance(step, int) and isinstance(value, list) and 0 <= step < len(value):
            value = value[step]
        elif isinstance(step, str) and isinstance(value, Mapping) and step in value:
            value = value[step]
        else:
            return MISSING
    return value


_VALIDATORS: dict[str, Draft202012Validator] = {}


def _validator(schema: Any) -> Draft202012Validator:
    key = json.dumps(schema, sort_keys=True)
    v = _VALIDATORS.get(key)
    if v is None:
        if len(_VALIDATORS) > 1024:
            _VALIDATORS.clear()
        v = _VALIDATORS[key] = Draft202012Validator(schema)
    return v


def _schema_valid(value: Any, schema: Any) -> bool:
    return value is not MISSING and _validator(schema).is_valid(value)


def _column(col: list[Any] | None, n: int) -> list[Any]:
    return list(col) if col is not None else [None] * n


def json_parse(completions: list[Any], **kwargs: Any) -> list[float]:
    """1.0 for only-JSON (bare or one fenced block), 0.5 for JSON with other text around it, else 0.0.
    See `parse_json_completion` for the exact rule."""
    return [parse_json_completion(c)[1] for c in completions]


def json_schema(completions: list[Any], schema: list[Any] | None = None, **kwargs: Any) -> list[float | None]:
    """1.0 if the parsed JSON validates against the row's `schema` (Draft 2020-12), else 0.0."""
    schemas = _column(schema, len(completions))
    out: list[float | None] = []
    for c, s in zip(completions, schemas):
        if s is None:
            out.append(None)
            continue
        out.append(1.0 if _schema_valid(parse_json_completion(c)[0], s) else 0.0)
    return out


def json_values(completions: list[Any], expected: list[Any] | None = None, **kwargs: Any) -> list[float | None]:
    """Fraction of the row's `expected` leaf values that are present, at the same path, and strictly equal
    in the parsed JSON. Extra keys or elements cost nothing here."""
    exps = _column(expected, len(completions))
    out: list[float | None] = []
    for c, exp in zip(completions, exps):
        value = parse_json_completion(c)[0]
        if value is MISSING:
            out.append(0.0)
            continue
        leaves = leaf_paths(exp)
        hits = sum(1 for path, leaf in leaves if strict_equal(leaf, _lookup(value, path)))
        out.append(hits / len(leaves))
    return out


def json_exact(
    completions: list[Any], schema: list[Any] | None = None, expected: list[Any] | None = None, **kwargs: Any
) -> list[float]:
    """The headline check: the parsed JSON validates against `schema` (when the row has one) and equals
    `expected` exactly under strict typing. Scores 1.0 when the completion is only that JSON (bare, or one
    fenced block), 0.5 when it is right but has other text around it, else 0.0. It passes at 0.5.

    The half score for a right answer wrapped in prose matters for RL, not just for tidiness: when a right
    answer with chatter scored the same as a clean one, the policy learned to append chatter and every
    completion ran to the token limit (measured: mean length rose from 60 to 96 tokens in 10 steps), which
    doubles the cost of sampling and training. When only clean answers scored, greedy answers (which almost
    always carry a sentence of prose) never scored and the model got no signal at all."""
    n = len(completions)
    schemas, exps = _column(schema, n), _column(expected, n)
    out: list[float] = []
    for c, s, exp in zip(completions, schemas, exps):
        value, ok = parse_json_completion(c)
        good = ok >= 0.5 and (s is None or _schema_valid(value, s)) and strict_equal(exp, value)
        out.append(ok if good else 0.0)
    return out


def json_feedback(
    completions: list[Any], schema: list[Any] | None = None, expected: list[Any] | None = None, **kwargs: Any
) -> list[str | None]:
    """What is wrong with each answer, in words (a Task.feedback function, envs/feedback.py): no JSON, prose
    around it, the first schema violation, or up to two wrong fields with the value they should have. The text is
    a hint for a self-distillation teacher, which may know the answer; the student never reads it."""
    n = len(completions)
    schemas, exps = _column(schema, n), _column(expected, n)
    out: list[str | None] = []
    for c, s, exp in zip(completions, schemas, exps):
        value, ok = parse_json_completion(c)
        if value is MISSING:
            out.append("Answer with one JSON value and nothing else; no JSON was found.")
            continue
        notes: list[str] = []
        if s is not None:
            errors = sorted(_validator(s).iter_errors(value), key=lambda e: list(e.path))
            if errors:
                where = "/".join(str(p) for p in errors[0].path) or "the top level"
                notes.append(f"schema violation at {where}: {errors[0].message[:160]}")
        if exp is not None:
            wrong = [(path, leaf) for path, leaf in leaf_paths(exp) if not strict_equal(leaf, _lookup(value, path))]
            for path, leaf in wrong[:2]:
                notes.append(f"field {'.'.join(str(p) for p in path) or '(value)'} should be {json.dumps(leaf)}")
            if len(wrong) > 2:
                notes.append(f"{len(wrong) - 2} more fields are wrong")
        if ok < 1.0:
            notes.append("write only the JSON, with no text around it")
        out.append("; ".join(notes) + "." if notes else None)
    return out


DEFAULT_WEIGHTS: dict[str, float] = {"json_parse": 0.1, "json_schema": 0.2, "json_values": 0.7, "json_exact": 1.0}
_FUNCS = {"json_parse": json_parse, "json_schema": json_schema, "json_values": json_values, "json_exact": json_exact}
_THRESHOLDS = {"json_parse": 0.5, "json_exact": 0.5}


def json_rubric(weights: Mapping[str, float] | None = None) -> Rubric:
    """The JSON rubric: parse 0.1, schema 0.2, values 0.7, exact 1.0 (headline pass = `json_exact`).
    `weights` overrides some of these by component name; an unknown name raises ValueError."""
    w = dict(DEFAULT_WEIGHTS)
    for k, v in (weights or {}).items():
        if k not in w:
            raise ValueError(f"unknown json reward component {k!r}; valid: {sorted(w)}")
        w[k] = float(v)
    comps = [
        RewardComponent(name=name, func=f, weight=w[name], pass_threshold=_THRESHOLDS.get(name, 1.0))
        for name, f in _FUNCS.items()
    ]
    return Rubric(components=comps, pass_component="json_exact")
