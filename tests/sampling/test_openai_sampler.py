import asyncio

import pytest

pytest.importorskip("fastapi")
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from posttrain.models import render_prompt, stop_token_ids
from posttrain.sampling import HFSampler
from posttrain.sampling.http_serve import serve_in_loop
from posttrain.sampling.openai_sampler import OpenAISampler, OpenAISamplerError
from posttrain.sampling.openai_server import create_app
from posttrain.sampling.scripted import CapturingSampler as Capturing
from posttrain.sampling.scripted import ScriptedSampler as Scripted
from posttrain.types import SampleParams


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_round_trip_through_posttrain_serve_gives_the_sampled_tokens(tiny):
    model, tok = tiny
    inner = Capturing(HFSampler(model, tok, stop_token_ids(model, tok), seed=0))
    inner.inner.policy_version = 5
    prompts = [render_prompt(tok, [{"role": "user", "content": "hello there"}]),
               render_prompt(tok, [{"role": "user", "content": "hi"}])]

    async def go():
        async with serve_in_loop(create_app(inner, tok, model_name="tiny")) as srv:
            s = OpenAISampler(srv.url, tokenizer=tok, timeout_s=30)
            out = await s.sample(prompts, SampleParams(max_tokens=10, temperature=1.0, seed=3), n=2)
            await s.close()
            return s, out

    s, out = run(go())
    assert s.model == "tiny" and [len(g) for g in out] == [2, 2]
    got = [c for g in out for c in g]
    assert [(p, c.token_ids, c.logprobs) for p, c in inner.seen] == [
        (prompts[i // 2], c.token_ids, c.logprobs) for i, c in enumerate(got)]
    assert all(c.policy_version == 5 and c.text == s.decode(c.token_ids) for c in got)
    assert s.stats["timeouts"] == 0 and s.stats["retries"] == 0


def test_timeouts_are_retried_counted_and_bounded(tiny):
    _, tok = tiny

    async def go():
        async with serve_in_loop(create_app(Scripted(tok, ["x"], delay_s=1.0), tok)) as srv:
            s = OpenAISampler(srv.url, model="m", timeout_s=0.1, max_retries=2, backoff_s=0.01)
            with pytest.raises(OpenAISamplerError, match="after 3 attempts: timeout"):
                await s.sample([[5, 6]], SampleParams(max_tokens=4))
            await s.close()
            return s

    s = run(go())
    assert s.stats["timeouts"] == 3 and s.stats["retries"] == 2


def test_5xx_is_retried_then_succeeds_and_4xx_raises(tiny):
    _, tok = tiny
    inner = create_app(Scripted(tok, ["ok"]), tok)
    flaky = FastAPI()
    hits = {"n": 0}

    @flaky.post("/v1/completions")
    async def completions(body: dict):
        hits["n"] += 1
        if hits["n"] == 1:
            return JSONResponse(status_code=503, content={"error": "busy"})
        if body["prompt"] == [[1]]:
            return JSONResponse(status_code=400, content={"error": {"message": "bad prompt"}})
        st = inner.state.posttrain
        from posttrain.sampling.openai_server import CompletionRequest
        from posttrain.sampling.openai_server import completions as route

        return await route(st, CompletionRequest(**body), None)

    async def go():
        async with serve_in_loop(flaky) as srv:
            s = OpenAISampler(srv.url + "/v1", model="m", timeout_s=5, max_retries=2, backoff_s=0.01)
            (c,), = await s.sample([[5, 6]], SampleParams(max_tokens=4))
            with pytest.raises(OpenAISamplerError, match="HTTP 400"):
                await s.sample([[1]], SampleParams(max_tokens=4))
            await s.close()
            return s, c

    s, c = run(go())
    assert c.text == "ok" and c.token_ids[-1] == tok.eos_token_id and s.stats["retries"] == 1


def test_server_without_token_ids_is_rejected_with_a_clear_error():
    app = FastAPI()

    @app.post("/v1/completions")
    async def completions(body: dict):
        return {"choices": [{"index": 0, "text": "hi", "finish_reason": "stop",
                             "logprobs": {"tokens": ["h", "i"], "token_logprobs": [-1.0, -1.0]}}]}

    async def go():
        async with serve_in_loop(app) as srv:
            s = OpenAISampler(srv.url, model="m", timeout_s=5)
            with pytest.raises(OpenAISamplerError, match="return_token_ids"):
                await s.sample([[1, 2]], SampleParams())
            await s.close()

    run(go())
