"""`json-extract`: read a few facts and answer with JSON that matches a given schema.

Each row is a chat prompt (a short system message; a user message with the schema shown as a compact JSON
skeleton, the facts, and the instruction to answer with only the JSON) plus the columns the rewards read:
`schema` (a JSON Schema dict), `expected` (the exact JSON value), `shape` (which of the schema shapes) and `entity` (the
name the row is about). Six shapes, balanced: flat person, product, event with a nested location, order
with an array of item objects, a top-level array of cities, and a contact with a tags array.

Train and held-out rows are split by entity: every name pool is halved (`json_data.split`), training rows
draw from one half and held-out rows from the other, so no held-out entity appears in training.
Scoring: `posttrain.rewards.json_rewards.json_rubric` (parse, schema, values, exact; the pass is exact).
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable
from typing import Any

from posttrain.envs.smoke_checks import SmokeCheck
from posttrain.envs.task import Task
from posttrain.rewards.json_rewards import json_feedback, json_rubric
from posttrain.tasks import json_data as D

SYSTEM = "You extract data as JSON."
# The prompt shows the schema as a skeleton of JSON type names, {"name":"string","age":"integer",...}: the
# 135M base model echoes a full JSON Schema back instead of filling it in, and the skeleton is ~40 tokens
# shorter. `schema_style="jsonschema"` shows the full schema instead. Facts come last, nearest the answer.
USER = "Format: {schema}\n{facts}\nReply with only the JSON of this data."


def _obj(props: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(props)}


STR, INT, NUM, BOOL = {"type": "string"}, {"type": "integer"}, {"type": "number"}, {"type": "boolean"}

SCHEMAS: dict[str, dict[str, Any]] = {
    "person": _obj({"name": STR, "age": INT, "city": STR}),
    "product": _obj({"name": STR, "price": NUM, "in_stock": BOOL}),
    "event": _obj({"title": STR, "date": STR, "location": _obj({"city": STR, "country": STR})}),
    "order": _obj({"customer": STR, "items": {"type": "array", "items": _obj({"name": STR, "qty": INT})}}),
    "cities": {"type": "array", "items": _obj({"city": STR, "population": INT})},
    "contact": _obj({"name": STR, "email": STR, "tags": {"type": "array", "items": STR}}),
}
SHAPES = list(SCHEMAS)
MONTHS = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]


class _Pools:
    """The name pools of one split."""

    def __init__(self, part: int) -> None:
        pick = lambda pool: D.split(pool)[part]
        self.first, self.last = pick(D.FIRST_NAMES), pick(D.LAST_NAMES)
        self.places, self.adjectives = pick(D.PLACES), pick(D.PRODUCT_ADJECTIVES)
        self.nouns, self.events = pick(D.PRODUCT_NOUNS), pick(D.EVENT_FIRST)

    def person(self, rng: random.Random) -> tuple[str, str]:
        return rng.choice(self.first), rng.choice(self.last)


Fact = tuple[str, Any, str]  # (facts text, expected, entity)


def _person(rng: random.Random, p: _Pools) -> Fact:
    first, last = p.person(rng)
    name, age, city = f"{first} {last}", rng.randint(18, 80), rng.choice(p.places)[0]
    if rng.random() < 0.5:
        text = f"{name} is {age} and lives in {city}."
    else:
        text = f"name: {name}, age: {age}, city: {city}"
    return text, {"name": name, "age": age, "city": city}, name


def _product(rng: random.Random, p: _Pools) -> Fact:
    name = f"{rng.choice(p.adjectives)} {rng.choice(p.nouns).capitalize()}"
    price = round(rng.randint(1, 99) + rng.choice([0.25, 0.5, 0.75, 0.49, 0.99]), 2)
    in_stock = rng.random() < 0.5
    if rng.random() < 0.5:
        text = f"The {name} costs {price} and is {'in' if in_stock else 'out of'} stock."
    else:
        text = f"name: {name}, price: {price}, in stock: {'yes' if in_stock else 'no'}"
    return text, {"name": name, "price": price, "in_stock": in_stock}, name


def _event(rng: random.Random, p: _Pools) -> Fact:
    title = f"{rng.choice(p.events)} {rng.choice(D.EVENT_SECOND)}"
    date = f"{rng.choice(MONTHS)} {rng.randint(1, 28)}"
    city, country = rng.choice(p.places)
    if rng.random() < 0.5:
        text = f"The {title} is on {date} in {city}, {country}."
    else:
        text = f"title: {title}, date: {date}, city: {city}, country: {country}"
    return text, {"title": title, "date": date, "location": {"city": city, "country": country}}, title


def _order(rng: random.Random, p: _Pools) -> Fact:
    customer = " ".join(p.person(rng))
    items = [{"name": n, "qty": rng.randint(1, 5)} for n in rng.sample(p.nouns, rng.randint(1, 3))]
    listed = ", ".join(f"{it['qty']} {it['name']}" for it in items)
    if rng.random() < 0.5:
        text = f"{customer} ordered {listed}."
    else:
        text = f"customer: {customer}, items: {listed}"
    return text, {"customer": customer, "items": items}, customer


def _cities(rng: random.Random, p: _Pools) -> Fact:
    rows = [{"city": c, "population": rng.randint(1000, 90000)} for c, _ in rng.sample(p.places, rng.randint(2, 3))]
    if rng.random() < 0.5:
        text = "; ".join(f"{r['city']} has {r['population']} people" for r in rows) + "."
    else:
        text = "population: " + ", ".join(f"{r['city']} {r['population']}" for r in rows)
    return text, rows, "+".join(r["city"] for r in rows)


def _contact(rng: random.Random, p: _Pools) -> Fact:
    first, last = p.person(rng)
    name = f"{first} {last}"
    email = f"{first.lower()}.{last.lower()}@{rng.choice(D.EMAIL_DOMAINS)}"
    tags = rng.sample(D.TAGS, rng.randint(1, 3))
    if rng.random() < 0.5:
        text = f"{name} ({email}) is tagged {', '.join(tags)}."
    else:
        text = f"name: {name}, email: {email}, tags: {', '.join(tags)}"
    return text, {"name": name, "email": email, "tags": tags}, name


MAKERS: dict[str, Callable[[random.Random, _Pools], Fact]] = {
    "person": _person,
    "product": _product,
    "event": _event,
    "order": _order,
    "cities": _cities,
    "contact": _contact,
}


def skeleton(schema: dict[str, Any]) -> Any:
    """The JSON value a schema describes, with each leaf replaced by its type name."""
    if schema["type"] == "object":
        return {k: skeleton(v) for k, v in schema["properties"].items()}
    if schema["type"] == "array":
        return [skeleton(schema["items"])]
    return schema["type"]


def _row(shape: str, rng: random.Random, pools: _Pools, schema_style: str) -> dict[str, Any]:
    text, expected, entity = MAKERS[shape](rng, pools)
    schema = copy.deepcopy(SCHEMAS[shape])  # rows own their schema: a consumer may mutate one
    shown = skeleton(schema) if schema_style == "skeleton" else schema
    user = USER.format(facts=text, schema=json.dumps(shown, separators=(",", ":")))
    return {
        "prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}],
        "schema": schema,
        "expected": expected,
        "shape": shape,
        "entity": entity,
    }


def _rows(n: int, rng: random.Random, pools: _Pools, schema_style: str) -> list[dict[str, Any]]:
    """`n` rows, shapes balanced (counts differ by at most one), in shuffled order."""
    shapes = [SHAPES[i % len(SHAPES)] for i in range(n)]
    rng.shuffle(shapes)
    return [_row(s, rng, pools, schema_style) for s in shapes]


def make_task(
    seed: int = 0,
    n_train: int = 400,
    n_eval: int = 48,
    weights: dict[str, float] | None = None,
    schema_style: str = "skeleton",
) -> Task:
    """The `json-extract` task. Deterministic in `seed`; the held-out rows do not depend on `n_train`.
    `weights` overrides rubric weights by component name (json_parse, json_schema, json_values, json_exact).
    `schema_style`: how the prompt shows the schema, "skeleton" (type names in place of values) or
    "jsonschema" (the full JSON Schema); rewards always validate against the full schema."""
    if schema_style not in ("skeleton", "jsonschema"):
        raise ValueError(f"schema_style must be 'skeleton' or 'jsonschema', got {schema_style!r}")
    if n_train < 1 or n_eval < 0:
        raise ValueError(f"need n_train >= 1 and n_eval >= 0, got n_train={n_train}, n_eval={n_eval}")
    rubric = json_rubric(weights)
    master = random.Random(seed)
    train_rng, eval_rng = random.Random(master.getrandbits(64)), random.Random(master.getrandbits(64))
    train_rows = _rows(n_train, train_rng, _Pools(0), schema_style)
    first = train_rows[0]
    return Task(
        name="json-extract",
        train_rows=train_rows,
        eval_rows=_rows(n_eval, eval_rng, _Pools(1), schema_style),
        smoke_checks=[
            SmokeCheck("the expected JSON passes", row=first, completion=json.dumps(first["expected"])),
            SmokeCheck("an empty object fails", row=first, completion="{}", expect="fail"),
        ],
        rubric=rubric,
        feedback=json_feedback,
        # A supervised warm start (`warm_start.steps`) on the expected JSON itself, written compactly as the
        # skeleton in the prompt is: the answer the exact reward wants, nothing around it.
        demonstrate=lambda row: [json.dumps(row["expected"], separators=(",", ":"))],
        description="Extract facts from a short text into JSON matching a given schema "
        f"({len(SHAPES)} shapes: {', '.join(SHAPES)}); held-out rows use unseen entities.",
        max_tokens=96,
        # The answer is one JSON value: a blank line or a closing fence after it means the model has moved on
        # to commentary. Stopping there (the text is cut before the stop, as in the OpenAI API) keeps
        # completions short; prose before the JSON also hits "\n\n" and scores 0, which is what we want.
        stop=["\n\n", "\n```"],
    )
