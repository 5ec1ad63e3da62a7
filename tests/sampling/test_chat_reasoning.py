"""A client's `reasoning_content` on an assistant message is kept for the chat template (sampling/chat_prompt.py),
bounded by the request's character limit like content."""

import asyncio

import pytest

pytest.importorskip("fastapi")
import httpx

from posttrain.sampling.chat_prompt import normalize_message
from posttrain.sampling.http_serve import serve_in_loop
from posttrain.sampling.openai_requests import RequestLimits
from posttrain.sampling.openai_server import create_app
from posttrain.sampling.scripted import ScriptedSampler


def test_reasoning_content_is_kept_for_the_template():
    m = normalize_message({"role": "assistant", "content": "5", "reasoning_content": "2+3"}, False)
    assert m == {"role": "assistant", "content": "5", "reasoning_content": "2+3"}
    assert "reasoning_content" not in normalize_message(
        {"role": "assistant", "content": "5", "reasoning_content": 7}, False
    )
    assert "reasoning_content" not in normalize_message(
        {"role": "user", "content": "q", "reasoning_content": "x"}, False
    )


def test_reasoning_content_counts_in_the_request_s_characters(tiny):
    _, tok = tiny
    app = create_app(ScriptedSampler(tok, ["ok"]), tok, limits=RequestLimits(max_chars=1000))
    msgs = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a", "reasoning_content": "x" * 5000},
        {"role": "user", "content": "q2"},
    ]

    async def go():
        async with serve_in_loop(app) as srv, httpx.AsyncClient(base_url=srv.url, timeout=30) as h:
            return await h.post("/v1/chat/completions", json={"messages": msgs})

    r = asyncio.run(asyncio.wait_for(go(), 60))
    assert r.status_code == 400 and "characters" in r.text
