"""Streaming on /v1/chat/completions and /v1/completions (sampling/openai_stream.py): OpenAI's chunk format as the
`openai` client reads it, and recorded exactly as a call that was not streamed."""

import asyncio
import json

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
import httpx
from openai.types import Completion as OpenAICompletion
from openai.types.chat import ChatCompletionChunk

from posttrain.sampling.http_serve import serve_in_loop
from posttrain.sampling.openai_server import create_app
from posttrain.sampling.scripted import CapturingSampler, ScriptedSampler

MSGS = [{"role": "user", "content": "1+2?"}]
TEXT = "The answer is three, as anyone who has ever counted on two hands will tell you at length."
TOOL_REPLY = 'Let me add.<tool_call>{"name": "add", "arguments": {"a": 1, "b": [2, "x"]}}</tool_call>'
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


async def with_client(app, fn):
    async with serve_in_loop(app) as srv:
        client = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="x", timeout=30, max_retries=0)
        try:
            return await fn(client, srv.url)
        finally:
            await client.close()


async def raw_events(url: str, path: str, body: dict) -> tuple[httpx.Response, list[str]]:
    """The SSE `data:` payloads of one streamed request, read as bytes (not through the openai client)."""
    async with httpx.AsyncClient(base_url=url, timeout=30) as h:
        r = await h.post(path, json=body)
    frames = r.text.split("\n\n")
    assert frames[-1] == "", "the stream ends with a blank line"
    assert all(f.startswith("data: ") for f in frames[:-1]), frames[:3]
    return r, [f[len("data: ") :] for f in frames[:-1]]


def test_chat_stream_is_openai_chunks_that_reassemble_the_reply(tiny):
    _, tok = tiny
    app = create_app(ScriptedSampler(tok, [TEXT]), tok, model_name="m")

    async def go(client, url):
        stream = await client.chat.completions.create(model="m", messages=MSGS, stream=True)
        chunks = [c async for c in stream]
        r, datas = await raw_events(url, "/v1/chat/completions", {"messages": MSGS, "stream": True})
        return chunks, r, datas

    chunks, r, datas = run(with_client(app, go))
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert datas[-1] == "[DONE]"
    for d in datas[:-1]:  # every payload is a valid chunk (validated, not just constructed)
        ChatCompletionChunk.model_validate(json.loads(d))
    assert len(chunks) > 2, "the reply comes in pieces"
    assert {c.object for c in chunks} == {"chat.completion.chunk"} and len({c.id for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == TEXT
    assert [c.choices[0].finish_reason for c in chunks] == [None] * (len(chunks) - 1) + ["stop"]
    assert all(c.usage is None for c in chunks)


def test_chat_stream_tool_call_reassembles_as_clients_do(tiny):
    _, tok = tiny
    app = create_app(ScriptedSampler(tok, [TOOL_REPLY]), tok)

    async def go(client, _):
        stream = await client.chat.completions.create(model="m", messages=MSGS, tools=TOOLS, stream=True)
        return [c async for c in stream]

    chunks = run(with_client(app, go))
    content, calls, finish = "", {}, None
    for c in chunks:  # what langchain / litellm / the Agents SDK do with the deltas
        ch = c.choices[0]
        content += ch.delta.content or ""
        for tc in ch.delta.tool_calls or []:
            slot = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
            slot["id"] = slot["id"] or tc.id
            slot["name"] += (tc.function.name or "") if tc.function else ""
            slot["arguments"] += (tc.function.arguments or "") if tc.function else ""
        finish = ch.finish_reason or finish
    assert content == "Let me add." and finish == "tool_calls"
    assert list(calls) == [0] and calls[0]["id"].startswith("call_") and calls[0]["name"] == "add"
    assert json.loads(calls[0]["arguments"]) == {"a": 1, "b": [2, "x"]}


def test_include_usage_sends_a_last_chunk_with_usage_and_no_choices(tiny):
    _, tok = tiny
    app = create_app(ScriptedSampler(tok, [TEXT]), tok)

    async def go(client, _):
        stream = await client.chat.completions.create(
            model="m", messages=MSGS, stream=True, stream_options={"include_usage": True},
            extra_body={"rollout_id": "u"},
        )
        return [c async for c in stream]

    chunks = run(with_client(app, go))
    (call,) = app.state.recorder.pop("u").calls
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert last.usage.prompt_tokens == len(call.prompt_ids)
    assert last.usage.completion_tokens == len(call.completion_ids)
    assert last.usage.total_tokens == len(call.prompt_ids) + len(call.completion_ids)
    assert all(c.usage is None for c in chunks[:-1]) and chunks[-2].choices[0].finish_reason == "stop"


def test_completions_stream(tiny):
    _, tok = tiny
    app = create_app(ScriptedSampler(tok, [TEXT]), tok)

    async def go(client, url):
        stream = await client.completions.create(model="m", prompt="abc", max_tokens=40, stream=True,
                                                 stream_options={"include_usage": True})
        chunks = [c async for c in stream]
        _, datas = await raw_events(url, "/v1/completions", {"prompt": [5, 6, 7], "stream": True, "n": 2})
        return chunks, datas

    chunks, datas = run(with_client(app, go))
    assert {c.object for c in chunks} == {"text_completion"}
    assert "".join(c.choices[0].text for c in chunks if c.choices) == TEXT
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens == len(tok("abc", add_special_tokens=False)
                                                                                ["input_ids"])
    assert datas[-1] == "[DONE]"
    # The type is written for whole answers: OpenAI's own chunks before the last have finish_reason null too.
    whole = lambda c: {**c, "choices": [{**x, "finish_reason": x["finish_reason"] or "stop"} for x in c["choices"]]}
    raw = [json.loads(d) for d in datas[:-1]]
    for c in raw:
        OpenAICompletion.model_validate(whole(c))
    for i in (0, 1):  # n=2: each choice streamed whole, with its own finish
        mine = [c["choices"][0] for c in raw if c["choices"][0]["index"] == i]
        assert "".join(x["text"] for x in mine) == TEXT
        assert [x["finish_reason"] for x in mine] == [None] * (len(mine) - 1) + ["stop"]


def test_a_streamed_call_is_recorded_as_a_non_streamed_one(tiny):
    _, tok = tiny
    sampler = CapturingSampler(ScriptedSampler(tok, [TOOL_REPLY], policy_version=3))
    app = create_app(sampler, tok)

    async def go(client, _):
        for rid, stream in (("plain", False), ("streamed", True)):
            r = await client.chat.completions.create(model="m", messages=MSGS, tools=TOOLS, stream=stream,
                                                     extra_body={"rollout_id": rid})
            if stream:
                [c async for c in r]
            r = await client.completions.create(model="m", prompt="abc", stream=stream,
                                                extra_body={"rollout_id": rid + "-text"})
            if stream:
                [c async for c in r]

    run(with_client(app, go))
    recorded = {rid: app.state.recorder.pop(rid).calls for rid in ("plain", "plain-text", "streamed", "streamed-text")}
    for plain, streamed in (("plain", "streamed"), ("plain-text", "streamed-text")):
        (a,), (b,) = recorded[plain], recorded[streamed]
        assert (a.prompt_ids, a.completion_ids, a.logprobs, a.policy_version, a.finish_reason, a.text) == (
            b.prompt_ids, b.completion_ids, b.logprobs, b.policy_version, b.finish_reason, b.text)
        assert a.policy_version == 3 and a.messages == b.messages and a.tools == b.tools
        strip = lambda reply: {**(reply or {}), "tool_calls": [c["function"] for c in (reply or {}).get("tool_calls", [])]}
        assert strip(a.reply) == strip(b.reply)  # the same reply (the call ids are fresh each time)
    # ... and they hold what the sampler returned, in call order
    order = [recorded[r][0] for r in ("plain", "plain-text", "streamed", "streamed-text")]
    assert [(c.prompt_ids, c.completion_ids) for c in order] == [(p, c.token_ids) for p, c in sampler.seen]


def test_stream_errors_before_sampling_keep_their_status(tiny):
    _, tok = tiny
    app = create_app(ScriptedSampler(tok, ["x"]), tok)

    async def go(_, url):
        async with httpx.AsyncClient(base_url=url, timeout=30) as h:
            bad = await h.post("/v1/chat/completions", json={"messages": MSGS, "stream": True, "n": 10**6})
            opts = await h.post("/v1/chat/completions",
                                json={"messages": MSGS, "stream": True, "stream_options": {"include_usage": "x"}})
        return bad, opts

    bad, opts = run(with_client(app, go))
    assert bad.status_code == 400 and bad.headers["content-type"] == "application/json"
    assert "n=1000000" in bad.json()["error"]["message"]
    assert opts.status_code == 422 and opts.json()["error"]["param"] == "stream_options.include_usage"
