"""The server's chat replies read with the model family's tool-call and reasoning formats (sampling/reply_parsers.py,
called from openai_chat.py): the family detected from the chat template, overridable per server."""

import asyncio
import json

import pytest

pytest.importorskip("fastapi")
import httpx

from posttrain.models.tiny import CHAT_TEMPLATE, tiny_tokenizer
from posttrain.sampling.openai_server import create_app
from posttrain.sampling.scripted import ScriptedSampler

MSGS = [{"role": "user", "content": "1+2?"}]
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}]
# The tiny ChatML template with a family's markers in a comment: it renders the same, it reads as that family.
LLAMA3 = CHAT_TEMPLATE + "{# <|python_tag|> respond with a JSON for a function call #}"
MISTRAL = CHAT_TEMPLATE + "{# [TOOL_CALLS] [ARGS] #}"
QWEN3 = CHAT_TEMPLATE + "{# <tool_call> <think> </think> #}"
QWEN3_CODER = CHAT_TEMPLATE + "{# <tool_call> <function=x> <parameter=y> #}"
R1 = CHAT_TEMPLATE.replace("'<|im_start|>assistant\n'", "'<|im_start|>assistant\n<think>\n'")


class SkippingSampler(ScriptedSampler):
    """ScriptedSampler whose text is decoded from its ids with special tokens skipped, as every real sampler's is."""

    def _sample(self, prompts_P, params, n):
        out = super()._sample(prompts_P, params, n)
        for group in out:
            for c in group:
                c.text = self.tok.decode(c.token_ids, skip_special_tokens=True)
        return out


def _tok(template):
    tok = tiny_tokenizer()
    tok.chat_template = template
    return tok


def chat(app, **body):
    async def go():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as h:
            r = await h.post("/v1/chat/completions", json={"model": "m", "messages": MSGS, **body})
            return r

    r = asyncio.run(asyncio.wait_for(go(), 60))
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def _calls(choice):
    return [(c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in choice["message"].get("tool_calls") or []]


def test_llama3_json_calls_from_a_llama_template():
    tok = _tok(LLAMA3)
    app = create_app(ScriptedSampler(tok, ['{"name": "add", "parameters": {"a": 1, "b": 2}}']), tok)
    choice = chat(app, tools=TOOLS)
    assert _calls(choice) == [("add", {"a": 1, "b": 2})] and choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == ""


def test_the_parser_is_overridable_per_server():
    tok = _tok(LLAMA3)
    reply = '{"name": "add", "parameters": {"a": 1, "b": 2}}'
    app = create_app(ScriptedSampler(tok, [reply]), tok, tool_parser="hermes")
    choice = chat(app, tools=TOOLS)
    assert _calls(choice) == [] and choice["message"]["content"] == reply


def test_qwen3_reasoning_and_hermes_calls():
    tok = _tok(QWEN3)
    reply = ('<think>\nThe user wants a sum.\n</think>\n\nLet me add.\n<tool_call>\n'
             '{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>')
    app = create_app(ScriptedSampler(tok, [reply]), tok)
    choice = chat(app, tools=TOOLS)
    assert choice["message"]["reasoning_content"] == "The user wants a sum."
    assert choice["message"]["content"] == "Let me add."
    assert _calls(choice) == [("add", {"a": 1, "b": 2})]


def test_a_call_written_inside_the_reasoning_is_not_a_call():
    tok = _tok(QWEN3)
    reply = '<think>maybe <tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>? no.</think>It is 3.'
    choice = chat(create_app(ScriptedSampler(tok, [reply]), tok), tools=TOOLS)
    assert _calls(choice) == [] and choice["message"]["content"] == "It is 3."
    assert "<tool_call>" in choice["message"]["reasoning_content"]


def test_r1_completion_starts_inside_the_think_block_the_prompt_opened():
    tok = _tok(R1)
    app = create_app(ScriptedSampler(tok, ["1 plus 2 is 3.\n</think>\n\nThe answer is 3.", "Still thinking"]), tok)
    choice = chat(app)
    assert choice["message"]["reasoning_content"] == "1 plus 2 is 3."
    assert choice["message"]["content"] == "The answer is 3."
    cut = chat(app)  # ran out of tokens while thinking: all of it is reasoning
    assert cut["message"]["reasoning_content"] == "Still thinking" and cut["message"]["content"] == ""


def test_no_reasoning_content_for_a_template_without_think_markers():
    tok = _tok(CHAT_TEMPLATE)  # SmolLM2's shape: hermes calls, no reasoning parser
    reply = "<think>not a reasoning model</think>Hi."
    choice = chat(create_app(ScriptedSampler(tok, [reply]), tok))
    assert choice["message"]["content"] == reply and "reasoning_content" not in choice["message"]


def test_mistral_calls_whose_markers_are_special_tokens():
    # [TOOL_CALLS] and [ARGS] are special tokens in Mistral's tokenizers: the sampler's text has them skipped, and
    # the server puts them back from the token ids before parsing.
    tok = _tok(MISTRAL)
    tok.add_special_tokens({"additional_special_tokens": ["[TOOL_CALLS]", "[ARGS]"]})
    reply = 'Adding.[TOOL_CALLS]add[ARGS]{"a": 1, "b": 2}[TOOL_CALLS]add[ARGS]{"a": 3, "b": {"c": [4]}}'
    sampler = SkippingSampler(tok, [reply])
    choice = chat(create_app(sampler, tok), tools=TOOLS)
    assert _calls(choice) == [("add", {"a": 1, "b": 2}), ("add", {"a": 3, "b": {"c": [4]}})]
    assert choice["message"]["content"] == "Adding."


def test_qwen3_coder_xml_calls_typed_by_the_request_tools():
    tok = _tok(QWEN3_CODER)
    reply = ("I will add.\n<tool_call>\n<function=add>\n<parameter=a>\n1\n</parameter>\n<parameter=b>\n2\n"
             "</parameter>\n</function>\n</tool_call>")
    choice = chat(create_app(ScriptedSampler(tok, [reply]), tok), tools=TOOLS)
    assert _calls(choice) == [("add", {"a": 1, "b": 2})] and choice["message"]["content"] == "I will add."


def test_streamed_reasoning_arrives_as_reasoning_content_deltas():
    tok = _tok(QWEN3)
    app = create_app(ScriptedSampler(tok, ["<think>Sum it.</think>It is 3."]), tok)

    async def go():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as h:
            r = await h.post("/v1/chat/completions", json={"model": "m", "messages": MSGS, "stream": True})
            return r.text

    text = asyncio.run(asyncio.wait_for(go(), 60))
    deltas = [json.loads(x[6:])["choices"][0]["delta"] for x in text.split("\n\n")
              if x.startswith("data: {") and json.loads(x[6:])["choices"]]
    assert "".join(d.get("reasoning_content") or "" for d in deltas) == "Sum it."
    assert "".join(d.get("content") or "" for d in deltas) == "It is 3."
