"""/v1/responses (sampling/openai_responses.py) through the `openai` client, its payloads validated with the client's
own pydantic types, and recorded with token ids like chat calls."""

import asyncio
import json

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
import httpx
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from posttrain.sampling.http_serve import serve_in_loop
from posttrain.sampling.openai_server import create_app
from posttrain.sampling.scripted import ScriptedSampler

TOOL_REPLY = 'Let me add.<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
TOOLS = [{"type": "function", "name": "add", "description": "a + b",
          "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}]
EVENTS = TypeAdapter(ResponseStreamEvent)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


async def with_client(app, fn, rid: str | None = None):
    async with serve_in_loop(app) as srv:
        headers = {"X-Rollout-Id": rid} if rid else None
        client = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="x", timeout=30, max_retries=0,
                                    default_headers=headers)
        try:
            return await fn(client, srv.url)
        finally:
            await client.close()


def test_plain_response_is_a_valid_response_and_is_recorded(tiny):
    _, tok = tiny
    app = create_app(ScriptedSampler(tok, ["Hello there, friend."]), tok, model_name="m")

    async def go(client, url):
        r = await client.responses.create(model="m", input="hi", instructions="Be brief.", max_output_tokens=30,
                                          temperature=0.5, top_p=0.9)
        async with httpx.AsyncClient(base_url=url, timeout=30) as h:
            raw = (await h.post("/v1/responses", json={"input": "hi", "instructions": "Be brief."})).json()
        return r, raw

    r, raw = run(with_client(app, go, rid="p"))
    Response.model_validate(raw)  # every required field there, each of the right type
    assert r.object == "response" and r.status == "completed" and r.output_text == "Hello there, friend."
    (msg,) = r.output
    assert msg.type == "message" and msg.role == "assistant" and msg.content[0].type == "output_text"
    assert r.temperature == 0.5 and r.top_p == 0.9 and r.max_output_tokens == 30 and r.instructions == "Be brief."
    (call,) = app.state.recorder.pop("p").calls
    assert r.usage.input_tokens == len(call.prompt_ids) and r.usage.output_tokens == len(call.completion_ids)
    prompt = tok.decode(call.prompt_ids)
    assert "Be brief." in prompt and "hi" in prompt  # instructions became the system message
    assert call.text == "Hello there, friend." and call.messages[0] == {"role": "system", "content": "Be brief."}


def test_function_tool_then_function_call_output_is_one_trajectory(tiny):
    _, tok = tiny
    app = create_app(ScriptedSampler(tok, [TOOL_REPLY, "It is 3."]), tok)

    async def go(client, _):
        first = [{"role": "user", "content": [{"type": "input_text", "text": "1+2?"}]}]
        r1 = await client.responses.create(model="m", input=first, tools=TOOLS)
        (fc,) = [o for o in r1.output if o.type == "function_call"]
        # the Agents SDK way: the whole history resent, the model's own items as it returned them
        items = first + [o.model_dump(exclude_none=True) for o in r1.output]
        items.append({"type": "function_call_output", "call_id": fc.call_id, "output": "3"})
        r2 = await client.responses.create(model="m", input=items, tools=TOOLS)
        return r1, r2

    r1, r2 = run(with_client(app, go, rid="t"))
    kinds = [o.type for o in r1.output]
    assert kinds == ["message", "function_call"] and r1.output[0].content[0].text == "Let me add."
    fc = r1.output[1]
    assert fc.name == "add" and json.loads(fc.arguments) == {"a": 1, "b": 2} and fc.call_id.startswith("call_")
    assert r2.output_text == "It is 3."
    rec = app.state.recorder.pop("t")
    assert rec.dropped_calls == 0 and len(rec.trajectory().turns) == 2  # the second prompt extends the first
    assert "<tools>" in tok.decode(rec.calls[0].prompt_ids) and '"add"' in tok.decode(rec.calls[0].prompt_ids)
    assert rec.calls[1].messages[-1] == {"role": "tool", "tool_call_id": fc.call_id, "name": "add", "content": "3"}


def test_previous_response_id_continues_the_conversation(tiny):
    _, tok = tiny
    app = create_app(ScriptedSampler(tok, ["Paris.", "About two million."]), tok)

    async def go(client, _):
        r1 = await client.responses.create(model="m", input="Capital of France?", instructions="Short answers.")
        r2 = await client.responses.create(model="m", input="Population?", previous_response_id=r1.id,
                                           instructions="Short answers.")
        missing = None
        try:
            await client.responses.create(model="m", input="x", previous_response_id="resp_nope")
        except openai.BadRequestError as e:
            missing = e
        return r1, r2, missing

    r1, r2, missing = run(with_client(app, go, rid="c"))
    assert r2.previous_response_id == r1.id and r2.output_text == "About two million."
    rec = app.state.recorder.pop("c")
    assert len(rec.calls) == 2 and rec.dropped_calls == 0  # spliced on the first call's sampled tokens
    second = tok.decode(rec.calls[1].prompt_ids)
    assert "Capital of France?" in second and "Paris." in second and "Population?" in second
    assert missing is not None and missing.body["param"] == "previous_response_id"
    assert "resp_nope" in missing.body["message"]


def test_streamed_response_events_are_valid_and_reassemble(tiny):
    _, tok = tiny
    text = "A fairly long streamed answer, long enough to come in more than one delta piece."
    app = create_app(ScriptedSampler(tok, [text, TOOL_REPLY, text]), tok)

    async def go(client, url):
        async with client.responses.stream(model="m", input="hi") as s:
            events = [e async for e in s]
            final = await s.get_final_response()
        stream = await client.responses.create(model="m", input="1+2?", tools=TOOLS, stream=True)
        tool_events = [e async for e in stream]
        async with httpx.AsyncClient(base_url=url, timeout=30) as h:
            raw = (await h.post("/v1/responses", json={"input": "hi", "stream": True})).text
        return events, final, tool_events, raw

    events, final, tool_events, raw = run(with_client(app, go))
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"] and types[-1] == "response.completed"
    for t in ("response.output_item.added", "response.content_part.added", "response.output_text.done",
              "response.content_part.done", "response.output_item.done"):
        assert types.count(t) == 1, t
    assert types.count("response.output_text.delta") > 1
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == text
    assert final.output_text == text and final.status == "completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    # the tool call: its arguments in deltas, then done with the name
    args = "".join(e.delta for e in tool_events if e.type == "response.function_call_arguments.delta")
    (done,) = [e for e in tool_events if e.type == "response.function_call_arguments.done"]
    assert json.loads(args) == {"a": 1, "b": 2} and done.arguments == args and done.name == "add"
    completed = tool_events[-1].response
    assert [o.type for o in completed.output] == ["message", "function_call"]
    # on the wire: `event: <type>` then `data: <json>`, each a valid event of the client's own types
    frames = [f for f in raw.split("\n\n") if f]
    for f in frames:
        head, data = f.split("\n", 1)
        event = EVENTS.validate_python(json.loads(data.removeprefix("data: ")))
        assert head == f"event: {event.type}"


def test_streamed_and_plain_responses_record_the_same_tokens(tiny):
    _, tok = tiny
    app = create_app(ScriptedSampler(tok, [TOOL_REPLY], policy_version=2), tok)

    async def go(client, _):
        await client.responses.create(model="m", input="1+2?", tools=TOOLS, extra_body={"rollout_id": "a"})
        stream = await client.responses.create(model="m", input="1+2?", tools=TOOLS, stream=True,
                                               extra_body={"rollout_id": "b"})
        [e async for e in stream]

    run(with_client(app, go))
    (a,), (b,) = app.state.recorder.pop("a").calls, app.state.recorder.pop("b").calls
    assert (a.prompt_ids, a.completion_ids, a.logprobs, a.policy_version) == (
        b.prompt_ids, b.completion_ids, b.logprobs, b.policy_version)
    assert a.policy_version == 2 and a.completion_ids


@pytest.mark.parametrize(
    "body,param,says",
    [
        ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type", "function"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]},
         "input[0].content[0].type", "text"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type", "previous_response_id"),
        ({"input": "x", "background": True}, "background", "background"),
        ({"input": "x", "conversation": "conv_1"}, "conversation", "previous_response_id"),
        ({"input": "x", "truncation": "auto"}, "truncation", "disabled"),
        ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}] * 2000},
         "input", "1024"),
    ],
)
def test_unsupported_fields_are_refused_in_openai_shape(tiny, body, param, says):
    _, tok = tiny
    app = create_app(ScriptedSampler(tok, ["x"]), tok)

    async def go(_, url):
        async with httpx.AsyncClient(base_url=url, timeout=30) as h:
            return await h.post("/v1/responses", json=body)

    r = run(with_client(app, go))
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
    assert err["param"] == param and says in err["message"], err


def test_logprobs_store_false_and_tool_choice_none(tiny):
    _, tok = tiny
    app = create_app(ScriptedSampler(tok, [TOOL_REPLY]), tok)

    async def go(client, _):
        r = await client.responses.create(model="m", input="1+2?", tools=TOOLS, tool_choice="none", store=False,
                                          include=["message.output_text.logprobs"], extra_body={"rollout_id": "n"})
        try:
            await client.responses.create(model="m", input="more", previous_response_id=r.id)
        except openai.BadRequestError as e:
            return r, e
        return r, None

    r, missing = run(with_client(app, go))
    (call,) = app.state.recorder.pop("n").calls
    (msg,) = r.output  # tool_choice="none": the reply is not parsed for calls, the block stays text
    assert msg.type == "message" and "<tool_call>" in r.output_text and call.reply.get("tool_calls") is None
    lps = msg.content[0].logprobs
    assert [x.logprob for x in lps] == call.logprobs and len(lps) == len(call.completion_ids)
    assert r.store is False and missing is not None and missing.body["code"] == "previous_response_not_found"
