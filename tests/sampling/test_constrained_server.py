"""tool_choice and response_format / text.format honoured by the OpenAI-compatible server (openai_chat.py
`output_plan`, sampling/constrained.py), through the `openai` client and raw HTTP, on a real tiny model."""

import asyncio
import json
import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("llguidance")
openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")
import httpx  # noqa: E402 - imported once the optional extras are known to be there
from hypothesis import HealthCheck, given, settings  # noqa: E402 - imported once the optional extras are known to be there
from hypothesis import strategies as st  # noqa: E402 - imported once the optional extras are known to be there

from posttrain.models import stop_token_ids  # noqa: E402 - imported once the optional extras are known to be there
from posttrain.sampling import HFSampler  # noqa: E402 - imported once the optional extras are known to be there
from posttrain.sampling.http_serve import serve_in_loop  # noqa: E402 - imported once the optional extras are known to be there
from posttrain.sampling.openai_server import create_app  # noqa: E402 - imported once the optional extras are known to be there
from posttrain.sampling.scripted import ScriptedSampler  # noqa: E402 - imported once the optional extras are known to be there

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 6}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
ADD = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
    "additionalProperties": False,
}
MUL = {
    "type": "object",
    "properties": {"x": {"type": "string", "maxLength": 8}},
    "required": ["x"],
    "additionalProperties": False,
}
CHAT_TOOLS = [
    {"type": "function", "function": {"name": "add", "parameters": ADD}},
    {"type": "function", "function": {"name": "mul", "parameters": MUL}},
]
FLAT_TOOLS = [{"type": "function", **t["function"]} for t in CHAT_TOOLS]
MSGS = [{"role": "user", "content": "hi"}]
SCHEMAS = {"add": ADD, "mul": MUL}


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 120))


@pytest.fixture
def app(tiny):
    model, tok = tiny
    return create_app(HFSampler(model, tok, stop_token_ids(model, tok), seed=0), tok, model_name="tiny")


async def with_client(app, fn, rid=None):
    async with serve_in_loop(app) as srv:
        headers = {"X-Rollout-Id": rid} if rid else None
        client = openai.AsyncOpenAI(
            base_url=srv.url + "/v1", api_key="x", timeout=60, max_retries=0, default_headers=headers
        )
        try:
            return await fn(client, srv.url)
        finally:
            await client.close()


def test_chat_json_schema_and_json_object_replies_validate(app):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}

    async def go(client, _):
        a = await client.chat.completions.create(
            model="tiny", messages=MSGS, n=6, max_tokens=60, seed=1, response_format=fmt
        )
        b = await client.chat.completions.create(
            model="tiny", messages=MSGS, n=4, max_tokens=60, seed=2, response_format={"type": "json_object"}
        )
        return a, b

    a, b = run(with_client(app, go))
    done = [c for c in a.choices if c.finish_reason == "stop"]
    assert len(done) >= 3
    for c in done:
        jsonschema.validate(json.loads(c.message.content), PERSON)
    assert all(isinstance(json.loads(c.message.content), dict) for c in b.choices if c.finish_reason == "stop")


def test_responses_text_format_json_schema_validates(app):
    fmt = {"format": {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}}

    async def go(client, _):
        return [
            await client.responses.create(
                model="tiny", input="hi", max_output_tokens=60, text=fmt, temperature=1.0, extra_body={"seed": s}
            )
            for s in range(4)
        ]

    done = [r for r in run(with_client(app, go)) if r.status == "completed"]
    assert len(done) >= 2
    for r in done:
        jsonschema.validate(json.loads(r.output_text), PERSON)
        assert r.text.format.type == "json_schema"  # the format it was held to is echoed back


def _check_call(name, arguments, want=None):
    assert name in SCHEMAS and (want is None or name == want)
    jsonschema.validate(json.loads(arguments), SCHEMAS[name])


def test_chat_tool_choice_required_and_named_always_call(app):
    async def go(client, _):
        req = await client.chat.completions.create(
            model="tiny", messages=MSGS, tools=CHAT_TOOLS, n=6, max_tokens=150, seed=3, tool_choice="required"
        )
        named = await client.chat.completions.create(
            model="tiny",
            messages=MSGS,
            tools=CHAT_TOOLS,
            n=6,
            max_tokens=150,
            seed=4,
            tool_choice={"type": "function", "function": {"name": "mul"}},
        )
        return req, named

    req, named = run(with_client(app, go))
    for resp, want in ((req, None), (named, "mul")):
        done = [c for c in resp.choices if c.finish_reason == "tool_calls"]
        assert len(done) >= 3 and all(c.finish_reason in ("tool_calls", "length") for c in resp.choices)
        for c in done:
            (call,) = c.message.tool_calls
            _check_call(call.function.name, call.function.arguments, want)


def test_responses_tool_choice_required_and_named_always_call(app):
    async def go(client, _):
        out = []
        for s, choice in enumerate(["required", {"type": "function", "name": "add"}] * 2):
            out.append(
                (
                    choice,
                    await client.responses.create(
                        model="tiny",
                        input="hi",
                        tools=FLAT_TOOLS,
                        tool_choice=choice,
                        max_output_tokens=60,
                        extra_body={"seed": s},
                    ),
                )
            )
        return out

    done = [(c, r) for c, r in run(with_client(app, go)) if r.status == "completed"]
    assert len(done) >= 2
    for choice, r in done:
        (call,) = [o for o in r.output if o.type == "function_call"]
        _check_call(call.name, call.arguments, None if choice == "required" else "add")


def test_forced_opening_is_prompt_side_and_the_next_turn_extends_it(tiny):
    """Any sampler (here a scripted one, which knows nothing of constraints): the opening is forced on the prompt
    side, the client reads opening + sampled text as a call, and the recorder trains only the sampled tokens."""
    _, tok = tiny
    app = create_app(ScriptedSampler(tok, ['{"a": 1, "b": 2}}\n</tool_call>', "It is 3."]), tok)
    opening = '<tool_call>\n{"name": "add", "arguments": '

    async def go(client, _):
        r1 = await client.chat.completions.create(
            model="m", messages=MSGS, tools=CHAT_TOOLS, tool_choice={"type": "function", "function": {"name": "add"}}
        )
        msg = r1.choices[0].message
        follow = MSGS + [
            msg.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "3"},
        ]
        r2 = await client.chat.completions.create(model="m", messages=follow, tools=CHAT_TOOLS)
        return r1, r2

    r1, r2 = run(with_client(app, go, rid="f"))
    (call,) = r1.choices[0].message.tool_calls
    assert call.function.name == "add" and json.loads(call.function.arguments) == {"a": 1, "b": 2}
    assert r2.choices[0].message.content == "It is 3."
    rec = app.state.recorder.pop("f")
    first = rec.calls[0]
    opening_ids = tok(opening, add_special_tokens=False)["input_ids"]
    assert first.prompt_ids[-len(opening_ids) :] == opening_ids  # the opening is the prompt's tail, not trained
    assert tok.decode(first.completion_ids, skip_special_tokens=True) == '{"a": 1, "b": 2}}\n</tool_call>'
    assert first.text.startswith(opening)
    assert rec.dropped_calls == 0 and len(rec.trajectory().turns) == 2  # the next prompt extends prompt + completion


def test_tool_choice_none_and_bad_choices(tiny):
    _, tok = tiny
    reply = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
    app = create_app(ScriptedSampler(tok, [reply]), tok)

    async def go(_, url):
        async with httpx.AsyncClient(base_url=url, timeout=30) as h:
            base = {"messages": MSGS, "tools": CHAT_TOOLS}
            none = (await h.post("/v1/chat/completions", json={**base, "tool_choice": "none"})).json()
            bad = [
                await h.post("/v1/chat/completions", json={**base, "tool_choice": c})
                for c in ({"type": "function", "function": {"name": "nope"}}, "sometimes", {"type": "custom"})
            ]
            no_tools = await h.post("/v1/chat/completions", json={"messages": MSGS, "tool_choice": "required"})
            resp = await h.post(
                "/v1/responses",
                json={"input": "hi", "tools": FLAT_TOOLS, "tool_choice": {"type": "function", "name": "nope"}},
            )
            return none, bad + [no_tools, resp]

    none, refused = run(with_client(app, go))
    assert none["choices"][0]["message"]["content"] == reply and "tool_calls" not in none["choices"][0]["message"]
    for r in refused:
        assert r.status_code == 400, r.text
        assert r.json()["error"]["type"] == "invalid_request_error" and r.json()["error"]["param"] == "tool_choice"


def _hostile_formats():
    deep: dict = {"type": "integer"}
    for _ in range(200):
        deep = {"type": "object", "properties": {"a": deep}}
    big = {"type": "object", "description": "x" * (1 << 20)}
    bomb = {"type": "string", "pattern": "((a{100}){100}){100}"}
    return [{"type": "no-such-type"}, deep, big, bomb, {"type": "object", "required": 5}]


def test_hostile_schemas_are_400_quickly_and_the_server_keeps_serving(app):
    async def go(_, url):
        out = []
        async with httpx.AsyncClient(base_url=url, timeout=60) as h:
            for schema in _hostile_formats():
                fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
                t = time.monotonic()
                r = await h.post(
                    "/v1/chat/completions", json={"messages": MSGS, "max_tokens": 4, "response_format": fmt}
                )
                out.append((r, time.monotonic() - t))
            t = time.monotonic()
            r = await h.post(
                "/v1/responses",
                json={
                    "input": "hi",
                    "text": {"format": {"type": "json_schema", "name": "x", "schema": _hostile_formats()[1]}},
                },
            )
            out.append((r, time.monotonic() - t))
            ok = await h.post("/v1/chat/completions", json={"messages": MSGS, "max_tokens": 4})
        return out, ok

    out, ok = run(with_client(app, go))
    for r, took in out:
        assert r.status_code == 400, r.text[:300]
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and err["param"] == "response_format" and took < 20
        assert len(r.text) < 2000  # the refusal does not echo the schema back
    assert ok.status_code == 200


_leaf = st.sampled_from(
    [
        {"type": "string"},
        {"type": "integer"},
        {"type": "boolean"},
        {"type": "null"},
        {"type": "number", "minimum": -5},
        {"enum": ["a", 1, None]},
        {"type": "string", "maxLength": 3},
        {"type": "strnig"},
        {"type": "string", "pattern": "[a-c]+"},
        {"const": 7},
        {},
    ]
)
_schemas = st.recursive(
    _leaf,
    lambda inner: st.one_of(
        st.builds(
            lambda p, req: {"type": "object", "properties": p, "required": req},
            st.dictionaries(st.text("abc", min_size=1, max_size=3), inner, max_size=3),
            st.lists(st.text("abc", min_size=1, max_size=3), max_size=2),
        ),
        st.builds(lambda i, n: {"type": "array", "items": i, "maxItems": n}, inner, st.integers(-1, 3)),
        st.builds(lambda xs: {"anyOf": xs}, st.lists(inner, min_size=1, max_size=3)),
    ),
    max_leaves=6,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(schema=_schemas)
def test_random_small_schemas_never_crash_the_server(app, schema):
    async def go(_, url):
        async with httpx.AsyncClient(base_url=url, timeout=60) as h:
            fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
            r = await h.post("/v1/chat/completions", json={"messages": MSGS, "max_tokens": 24, "response_format": fmt})
            ok = await h.post("/v1/chat/completions", json={"messages": MSGS, "max_tokens": 2})
            return r, ok

    r, ok = run(with_client(app, go))
    assert r.status_code in (200, 400), r.text[:300]
    assert ok.status_code == 200
    if r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "stop":
        jsonschema.validate(json.loads(r.json()["choices"][0]["message"]["content"]), schema)
