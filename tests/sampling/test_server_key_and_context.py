"""cluster.backend=server against a keyed `posttrain serve`: the sampler and the weight reload send the key; a
prompt past the served model's context fails its caller before any request (issue #52)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from posttrain.sampling.context import ContextBudget, ContextOverflow
from posttrain.sampling.openai_sampler import OpenAISampler
from posttrain.sampling.weight_ipc import ServerWeights
from posttrain.types import SampleParams


def test_a_prompt_past_the_context_fails_before_any_request():
    # port 9 (discard) on loopback: a request would fail with a transport error, not ContextOverflow
    s = OpenAISampler("http://127.0.0.1:9", model="m", context=ContextBudget(64), timeout_s=1, max_retries=0)
    with pytest.raises(ContextOverflow, match="context of 64 tokens"):
        asyncio.run(s.sample([[1] * 60], SampleParams(max_tokens=8)))


def test_the_weight_reload_sends_the_key(tiny, tmp_path, monkeypatch):
    model, _ = tiny
    seen = []

    def post(url, json=None, timeout=None, headers=None):
        seen.append(headers)
        return httpx.Response(200, json={"policy_version": 1})

    monkeypatch.setattr(httpx, "post", post)
    m = ServerWeights(model, tmp_path, "http://127.0.0.1:1", timeout_s=1, retries=0, api_key="s3cret").push(1)
    assert "time/weight_sync" in m
    assert seen == [{"Authorization": "Bearer s3cret"}]
    assert OpenAISampler("http://x", api_key="s3cret").headers["Authorization"] == "Bearer s3cret"
