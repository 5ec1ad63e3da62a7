"""Errors of the OpenAI-compatible server in OpenAI's shape (sampling/openai_requests.py): unknown routes, wrong
methods, refused fields."""

import asyncio

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
import httpx

from posttrain.sampling.http_serve import serve_in_loop
from posttrain.sampling.openai_server import create_app
from posttrain.sampling.scripted import ScriptedSampler


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_unknown_routes_and_methods_answer_in_openai_shape(tiny):
    _, tok = tiny
    app = create_app(ScriptedSampler(tok, ["x"]), tok)

    async def go():
        async with serve_in_loop(app) as srv:
            async with httpx.AsyncClient(base_url=srv.url, timeout=30) as h:
                unknown = await h.post("/v1/embeddings", json={"input": "x"})
                method = await h.get("/v1/chat/completions")
            client = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="x", timeout=30, max_retries=0)
            try:
                await client.embeddings.create(model="m", input="x")
            except openai.NotFoundError as e:
                caught = e
            await client.close()
        return unknown, method, caught

    unknown, method, caught = run(go())
    assert unknown.status_code == 404
    err = unknown.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error" and err["code"] == "unknown_url"
    for route in ("POST /v1/chat/completions", "POST /v1/completions", "POST /v1/responses", "GET /v1/models"):
        assert route in err["message"], err["message"]
    assert "POST /v1/embeddings" in err["message"]
    assert method.status_code == 405 and method.json()["error"]["code"] == "method_not_allowed"
    assert "POST /v1/chat/completions" in method.json()["error"]["message"]
    assert "/v1/embeddings" in caught.message and "model" not in caught.message.split("serves")[0].lower()


def test_refused_chat_fields_name_what_to_use_instead(tiny):
    _, tok = tiny
    app = create_app(ScriptedSampler(tok, ["x"]), tok)
    image = [{"role": "user", "content": [{"type": "text", "text": "what is this?"},
                                          {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]

    async def go():
        async with serve_in_loop(app) as srv:
            async with httpx.AsyncClient(base_url=srv.url, timeout=30) as h:
                return (
                    await h.post("/v1/completions", json={"prompt": "x", "echo": True}),
                    await h.post("/v1/chat/completions", json={"messages": image}),
                    await h.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}],
                                                               "tools": [{"type": "custom", "name": "f"}]}),
                )

    echo, img, tool = run(go())
    for r, param, says in ((echo, "echo", "echo"), (img, "messages[0].content[1].type", "text"),
                           (tool, "tools[0].type", "function")):
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"}, err
        assert err["param"] == param and says in err["message"], err
