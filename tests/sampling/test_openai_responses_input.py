"""Responses input items and tools as chat messages (sampling/openai_responses_input.py)."""

import pytest

pytest.importorskip("fastapi")
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.sampling.openai_requests import BadRequest
from posttrain.sampling.openai_responses_input import chat_tools, flat_tools, input_messages


def test_items_become_chat_messages():
    items = [
        {"role": "developer", "content": "rules"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "1+"},
                                                         {"type": "input_text", "text": "2?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Adding."}]},
        {"type": "function_call", "call_id": "c1", "name": "add", "arguments": '{"a": 1}'},
        {"type": "function_call", "call_id": "c2", "name": "add", "arguments": {"a": 2}},
        {"type": "function_call_output", "call_id": "c1", "output": "1"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "2"}]},
        {"type": "function_call", "call_id": "c3", "name": "done", "arguments": "{}"},
    ]
    msgs = input_messages(items, 100)
    assert msgs[:2] == [{"role": "system", "content": "rules"}, {"role": "user", "content": "1+2?"}]
    assert msgs[2]["role"] == "assistant" and msgs[2]["content"] == "Adding."
    assert [c["id"] for c in msgs[2]["tool_calls"]] == ["c1", "c2"]  # both calls belong to that turn
    assert msgs[2]["tool_calls"][1]["function"] == {"name": "add", "arguments": '{"a": 2}'}
    assert msgs[3:5] == [{"role": "tool", "tool_call_id": "c1", "name": "add", "content": "1"},
                         {"role": "tool", "tool_call_id": "c2", "name": "add", "content": "2"}]
    assert msgs[5] == {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c3", "type": "function", "function": {"name": "done", "arguments": "{}"}}]}
    assert input_messages("hi", 1) == [{"role": "user", "content": "hi"}]


def test_tools_flat_and_nested_and_back():
    flat = [{"type": "function", "name": "f", "description": "d", "parameters": {"type": "object"}, "strict": True}]
    nested = [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"},
                                                "strict": True}}]
    assert chat_tools(flat) == chat_tools(nested) == nested
    assert flat_tools(chat_tools(flat)) == flat
    assert chat_tools(None) is None and chat_tools([]) is None
    with pytest.raises(BadRequest) as e:
        chat_tools([{"type": "function", "parameters": {}}])
    assert e.value.param == "tools[0].name"


json_leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=8))
json_value = st.recursive(
    json_leaf,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=12,
)
keys = st.sampled_from(["type", "role", "content", "call_id", "name", "arguments", "output", "text", "id"])
kinds = st.sampled_from(["message", "function_call", "function_call_output", "reasoning", "input_text",
                         "output_text", "input_image", "item_reference", "web_search_call", None])
item = st.one_of(
    json_value,
    st.dictionaries(keys, st.one_of(json_value, kinds, st.lists(st.dictionaries(keys, st.one_of(json_value, kinds)),
                                                                   max_size=3)), max_size=6),
)


@settings(max_examples=150, deadline=None)
@given(items=st.lists(item, max_size=8))
def test_any_input_is_messages_or_a_bad_request(items):
    """Hostile input: every failure is a BadRequest naming a field of the input; a success is chat messages whose
    contents are strings."""
    try:
        msgs = input_messages(items, 1024)
    except BadRequest as e:
        assert e.param is not None and e.param.startswith("input")
        return
    for m in msgs:
        assert m["role"] in ("system", "user", "assistant", "tool") and isinstance(m["content"], str)
        for c in m.get("tool_calls", []):
            assert isinstance(c["id"], str) and isinstance(c["function"]["arguments"], str)
