import asyncio
import json

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
import httpx

from posttrain.models import render_prompt, stop_token_ids
from posttrain.sampling import HFSampler
from posttrain.sampling.http_serve import serve_in_loop
from posttrain.sampling.openai_server import create_app
from posttrain.sampling.scripted import CapturingSampler as Capturing
from posttrain.sampling.scripted import ScriptedSampler
from posttrain.sampling.tool_calls import parse_tool_calls


@pytest.fixture
def hf(tiny):
    model, tok = tiny
    return Capturing(HFSampler(model, tok, stop_token_ids(model, tok), seed=0)), tok


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_chat_records_exact_tokens_and_logprobs_over_http(hf):
    sampler, tok = hf
    app = create_app(sampler, tok, model_name="tiny")
    msgs = [{"role": "user", "content": "hello there"}]

    async def go():
        async with serve_in_loop(app) as srv:
            client = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="x", timeout=30, max_retries=0,
                                        default_headers={"X-Rollout-Id": "r1"})
            r1 = await client.chat.completions.create(model="tiny", messages=msgs, max_tokens=12, logprobs=True,
                                                      temperature=1.0)
            follow = msgs + [r1.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "sure?"}]
            r2 = await client.chat.completions.create(model="tiny", messages=follow, max_tokens=8, logprobs=True,
                                                      extra_body={"return_token_ids": True})
            await client.close()
            return r1, r2

    r1, r2 = run(go())
    record = app.state.recorder.pop("r1")
    assert len(record.calls) == 2 and len(sampler.seen) == 2
    for call, (prompt, comp), resp in zip(record.calls, sampler.seen, (r1, r2)):
        assert call.prompt_ids == prompt and call.completion_ids == comp.token_ids and call.logprobs == comp.logprobs
        assert [x.logprob for x in resp.choices[0].logprobs.content] == comp.logprobs
        assert resp.choices[0].message.content == comp.text
    assert record.calls[0].prompt_ids == render_prompt(tok, msgs)
    assert r2.model_extra["prompt_token_ids"] == record.calls[1].prompt_ids
    assert r2.choices[0].model_extra["token_ids"] == record.calls[1].completion_ids
    # The follow-up prompt was spliced onto the sampled tokens, so both calls form one trajectory.
    assert record.dropped_calls == 0
    traj = record.trajectory()
    assert len(traj.turns) == 2
    _tokens, mask, _logps = traj.sequence()
    assert sum(mask) == len(record.calls[0].completion_ids) + len(record.calls[1].completion_ids)


def test_models_completions_token_ids_and_body_rollout_id(hf):
    sampler, tok = hf
    app = create_app(sampler, tok, model_name="tiny")
    prompt = render_prompt(tok, [{"role": "user", "content": "hi"}])

    async def go():
        async with serve_in_loop(app) as srv:
            client = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="x", timeout=30, max_retries=0)
            models = await client.models.list()
            text = await client.completions.create(model="tiny", prompt="abc", max_tokens=5, logprobs=0)
            ids = await client.completions.create(model="tiny", prompt=prompt, max_tokens=6, logprobs=0, n=2,
                                                  extra_body={"rollout_id": "b", "return_tokens_as_token_ids": True,
                                                              "seed": 7})
            await client.close()
            return models, text, ids

    models, text, ids = run(go())
    assert [m.id for m in models.data] == ["tiny"]
    assert len(text.choices) == 1 and len(text.choices[0].logprobs.token_logprobs) >= 1
    assert text.choices[0].text == sampler.seen[0][1].text
    calls = app.state.recorder.pop("b").calls
    assert len(calls) == 2 and all(c.prompt_ids == prompt for c in calls)
    for ch, call in zip(ids.choices, calls):
        assert [int(t.split(":")[1]) for t in ch.logprobs.tokens] == call.completion_ids
        assert ch.logprobs.token_logprobs == call.logprobs
    assert app.state.recorder.rollout_ids() == []  # calls without a rollout id were not recorded


def test_tool_calls_are_parsed_into_the_response(tiny):
    _, tok = tiny
    reply = 'Let me add.<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
    app = create_app(ScriptedSampler(tok, [reply, "It is 3."]), tok)
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    msgs = [{"role": "user", "content": "1+2?"}]

    async def go():
        async with serve_in_loop(app) as srv:
            client = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="x", timeout=30, max_retries=0,
                                        default_headers={"X-Rollout-Id": "t"})
            r = await client.chat.completions.create(model="m", messages=msgs, tools=tools)
            call = r.choices[0].message.tool_calls[0]
            follow = msgs + [r.choices[0].message.model_dump(exclude_none=True),
                             {"role": "tool", "tool_call_id": call.id, "content": "3"}]
            r2 = await client.chat.completions.create(model="m", messages=follow, tools=tools)
            await client.close()
            return r, r2

    r, r2 = run(go())
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls" and ch.message.content == "Let me add."
    assert ch.message.tool_calls[0].function.name == "add"
    assert json.loads(ch.message.tool_calls[0].function.arguments) == {"a": 1, "b": 2}
    assert r2.choices[0].message.content == "It is 3." and r2.choices[0].finish_reason == "stop"
    rec = app.state.recorder.pop("t")
    assert rec.dropped_calls == 0 and len(rec.trajectory().turns) == 2  # the tool turn kept the prefix contract
    # Tools reach the prompt even though the tiny template ignores them (system message in Hermes format).
    assert "<tools>" in tok.decode(rec.calls[0].prompt_ids)


def test_parse_tool_calls_reports_bad_blocks():
    content, calls, errors = parse_tool_calls('a<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>'
                                              '<tool_call>{not json}</tool_call>')
    assert calls == [{"name": "f", "arguments": {"x": 1}}]
    assert len(errors) == 1 and "not valid JSON" in errors[0] and "{not json}" in content


def test_malformed_requests_get_4xx_and_timeouts_504(tiny):
    _, tok = tiny
    app = create_app(ScriptedSampler(tok, ["slow"], delay_s=2.0), tok, request_timeout_s=0.2)

    async def go():
        async with serve_in_loop(app) as srv:
            async with httpx.AsyncClient(base_url=srv.url, timeout=10) as h:
                codes = [
                    (await h.post("/v1/chat/completions", content=b"{not json")).status_code,
                    (await h.post("/v1/chat/completions", json={"messages": []})).status_code,
                    (await h.post("/v1/chat/completions", json={"messages": [{"content": "no role"}]})).status_code,
                    (await h.post("/v1/completions", json={"prompt": [10**9]})).status_code,
                    (await h.post("/v1/completions", json={"prompt": "x", "echo": True})).status_code,
                    (await h.post("/v1/completions", json={"prompt": "x", "max_tokens": 0})).status_code,
                ]
                timed_out = await h.post("/v1/completions", json={"prompt": "x"})
                health = (await h.get("/health")).json()
        return codes, timed_out, health

    codes, timed_out, health = run(go())
    assert codes == [422, 422, 400, 400, 400, 422]
    assert timed_out.status_code == 504 and "timed out" in timed_out.json()["error"]["message"]
    assert health["timeouts"] == 1


def test_rewritten_history_splits_into_chains(tiny):
    _, tok = tiny
    app = create_app(ScriptedSampler(tok, ["A", "B", "C"]), tok)

    async def go():
        async with serve_in_loop(app) as srv:
            client = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="x", timeout=30, max_retries=0)
            u = [{"role": "user", "content": "q"}]
            a = await client.chat.completions.create(model="m", messages=u, extra_body={"rollout_id": "s"})
            # history rewritten: the agent drops the first answer and asks something else
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "other"}],
                                                 extra_body={"rollout_id": "s"})
            await client.chat.completions.create(
                model="m", extra_body={"rollout_id": "s"},
                messages=u + [{"role": "assistant", "content": a.choices[0].message.content},
                              {"role": "user", "content": "more"}])
            await client.close()

    run(go())
    rec = app.state.recorder.pop("s")
    assert [len(ch) for ch in rec.chains()] == [2, 1]  # call 3 continues call 1, call 2 stands alone
    assert rec.dropped_calls == 1 and len(rec.trajectories()) == 2
    assert rec.trajectory().turns[1].prompt_ids[: len(rec.calls[0].prompt_ids)] == rec.calls[0].prompt_ids
