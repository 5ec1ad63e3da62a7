"""/v1/responses and thinking models (sampling/openai_responses.py, openai_responses_input.py): a reply's reasoning
is a `reasoning` output item before its message and calls, as OpenAI's; sent back as an input item it is that
turn's reasoning_content again, which the chat template renders (Qwen3's, after the last user query)."""

import asyncio

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("openai")
import openai
from fixtures.templates.thinking_tokenizers import thinking_tokenizer
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from posttrain.sampling.http_serve import serve_in_loop
from posttrain.sampling.openai_responses_input import input_messages
from posttrain.sampling.openai_server import create_app
from posttrain.sampling.scripted import ScriptedSampler

TOOLS = [
    {
        "type": "function",
        "name": "add",
        "description": "a + b",
        "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}},
    }
]
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'


def test_reasoning_is_an_output_item_and_comes_back_as_the_turn_s_reasoning():
    tok = thinking_tokenizer("qwen3")
    sampler = ScriptedSampler(tok, [f"<think>\nI add them.\n</think>\n\n{CALL}", "<think>\nIt is 3.\n</think>\n\n3"])
    app = create_app(sampler, tok, model_name="m")

    async def go():
        async with serve_in_loop(app) as srv:
            client = openai.AsyncOpenAI(
                base_url=srv.url + "/v1",
                api_key="x",
                timeout=30,
                max_retries=0,
                default_headers={"X-Rollout-Id": "r"},
            )
            try:
                first = await client.responses.create(model="m", input="1+2?", tools=TOOLS, store=False)
                items = [i.model_dump(exclude_none=True) for i in first.output]
                out = [{k: v for k, v in i.items() if k != "status"} for i in items]
                inputs = [{"role": "user", "content": "1+2?"}, *out]
                inputs.append({"type": "function_call_output", "call_id": items[1]["call_id"], "output": "3"})
                second = await client.responses.create(model="m", input=inputs, tools=TOOLS, store=False)
                return first, second
            finally:
                await client.close()

    first, second = asyncio.run(asyncio.wait_for(go(), 60))
    Response.model_validate(first.model_dump())
    reasoning, call = first.output
    assert reasoning.type == "reasoning" and reasoning.summary == []
    assert reasoning.content[0].type == "reasoning_text" and reasoning.content[0].text == "I add them."
    assert call.type == "function_call" and call.name == "add"
    assert second.output[0].type == "reasoning" and second.output_text == "3"
    first_call, second_call = app.state.recorder.pop("r").calls
    turn = next(m for m in second_call.messages if m["role"] == "assistant")
    assert turn["reasoning_content"] == "I add them." and turn["tool_calls"][0]["function"]["name"] == "add"
    # The template rendered the reasoning it was given back: the call extends the first, token for token.
    assert "<think>\nI add them.\n</think>" in tok.decode(second_call.prompt_ids)
    assert second_call.prompt_ids[: len(first_call.prompt_ids)] == first_call.prompt_ids


def test_a_streamed_reasoning_item_is_valid_events():
    from posttrain.sampling.openai_responses import response_events

    item = {"id": "rs_1", "type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "hm"}]}
    resp = {"id": "resp_1", "status": "completed", "output": [item]}
    events = list(response_events(resp))[2:-1]
    kinds = [e["type"] for e in events]
    assert kinds == [
        "response.output_item.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.output_item.done",
    ]
    for e in events:
        TypeAdapter(ResponseStreamEvent).validate_python(e)


def test_reasoning_input_items_join_the_turn_after_them():
    items = [
        {"role": "user", "content": "q"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "A"}]},
        {"role": "assistant", "content": "answer"},
        {"role": "user", "content": "q2"},
        {"type": "reasoning", "id": "rs_2", "summary": [], "content": [{"type": "reasoning_text", "text": "B"}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"},
        {"type": "reasoning", "id": "rs_3", "summary": [{"type": "summary_text", "text": "only a summary"}]},
        {"type": "reasoning", "id": "rs_4", "summary": [], "content": [{"type": "reasoning_text", "text": "lost"}]},
    ]
    msgs = input_messages(items, 100)
    assert [m["role"] for m in msgs] == ["user", "assistant", "user", "assistant", "tool"]
    assert msgs[1] == {"role": "assistant", "content": "answer", "reasoning_content": "A"}
    assert msgs[3]["reasoning_content"] == "B" and msgs[3]["tool_calls"][0]["id"] == "c1"
    assert all("_reasoning_only" not in m for m in msgs)


ITEM = st.one_of(
    st.builds(lambda t: {"type": "reasoning", "content": [{"type": "reasoning_text", "text": t}]}, st.text(max_size=5)),
    st.builds(lambda r, c: {"role": r, "content": c}, st.sampled_from(["user", "assistant", "system"]), st.text()),
    st.builds(
        lambda i: {"type": "function_call", "call_id": f"c{i}", "name": "f", "arguments": "{}"}, st.integers(0, 3)
    ),
    st.builds(lambda i: {"type": "function_call_output", "call_id": f"c{i}", "output": "x"}, st.integers(0, 3)),
    st.just({"type": "reasoning", "content": "not a list"}),
)


@given(st.lists(ITEM, max_size=12))
@settings(max_examples=200, deadline=None)
def test_any_order_of_reasoning_items_gives_plain_chat_messages(items):
    msgs = input_messages(items, 100)
    for m in msgs:
        assert "_reasoning_only" not in m
        assert "reasoning_content" not in m or (m["role"] == "assistant" and m["reasoning_content"])
    n_other = sum(1 for i in items if i.get("type") != "reasoning")
    assert len(msgs) <= n_other  # a reasoning item never becomes a turn of its own
