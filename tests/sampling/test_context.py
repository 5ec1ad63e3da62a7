"""Per-row context errors (sampling/context.py `ContextBudget.fit_rows`): a sampling call of several prompts, one of
them past the context, serves the others; the row that does not fit comes back as n completions with
finish_reason "context_overflow", no tokens and the reason in `error`. A call of one prompt still raises
ContextOverflow (what every env's call is), and so does a call none of whose prompts fits.

Every sampler that takes several rows: the scripted one, the own decode loop (sample and sample_sync), the
coalescer every engine batches through (vLLM in process, vLLM servers, Ray actors), the OpenAI-compatible client.
(The rule itself, `fit`, is tested in tests/envs/test_context_budget.py.)"""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.models import stop_token_ids
from posttrain.sampling.coalesce import Coalescer
from posttrain.sampling.context import ContextBudget, ContextOverflow
from posttrain.sampling.hf_sampler import HFSampler
from posttrain.sampling.openai_sampler import OpenAISampler
from posttrain.sampling.scripted import ScriptedSampler
from posttrain.types import Completion, SampleParams

SHORT, LONG, OTHER = [5] * 10, [6] * 60, [7] * 12  # in a context of 64 with max_tokens 8, LONG does not fit


def _overflowed(group, n, limit):
    assert len(group) == n
    for c in group:
        assert c.finish_reason == "context_overflow" and c.token_ids == [] and c.logprobs == [] and c.text == ""
        assert c.error and f"context of {limit} tokens" in c.error and "60 tokens" in c.error


def _served(group, n):
    assert len(group) == n and all(c.finish_reason in ("stop", "length") and c.token_ids for c in group)
    assert all(c.error is None for c in group)


def test_the_scripted_sampler_serves_the_rows_that_fit(tiny):
    _, tok = tiny
    s = ScriptedSampler(tok, ["a b"], context=ContextBudget(64))
    short, long_, other = asyncio.run(s.sample([SHORT, LONG, OTHER], SampleParams(max_tokens=8), n=2))
    _served(short, 2)
    _served(other, 2)
    _overflowed(long_, 2, 64)
    assert s.prompts == [SHORT, OTHER]  # the long row never reached the sampler


def test_one_prompt_or_none_that_fits_still_raises(tiny):
    _, tok = tiny
    s = ScriptedSampler(tok, ["a"], context=ContextBudget(64))
    with pytest.raises(ContextOverflow, match="context of 64"):
        asyncio.run(s.sample([LONG], SampleParams(max_tokens=8), n=3))
    with pytest.raises(ContextOverflow):
        asyncio.run(s.sample([LONG, [1] * 70], SampleParams(max_tokens=8)))
    assert s.calls == 0


def test_the_own_decode_loop_serves_the_rows_that_fit(tiny):
    model, tok = tiny
    s = HFSampler(model, tok, stop_token_ids(model, tok), seed=0, context=ContextBudget(64))
    greedy = SampleParams(max_tokens=8, temperature=0.0)
    alone = [s.sample_sync([p], greedy)[0][0].token_ids for p in (SHORT, OTHER)]
    for out in (s.sample_sync([SHORT, LONG, OTHER], greedy, n=2),
                asyncio.run(s.sample([SHORT, LONG, OTHER], greedy, n=2))):
        _served(out[0], 2)
        _served(out[2], 2)
        _overflowed(out[1], 2, 64)
        assert [out[0][0].token_ids, out[2][0].token_ids] == alone  # the same tokens as each row sampled alone
        assert out[1][0].policy_version == out[0][0].policy_version == s.policy_version


def test_a_coalesced_engine_never_sees_the_row_that_does_not_fit():
    # What vLLM (in process, servers) and the Ray actors sit behind: an engine that refuses a whole call for one
    # row past its context. A caller's long row is left out of the batch; its other rows and the other callers'
    # are served in one batch.
    batches: list[list[list[int]]] = []

    async def engine(rows, params):
        if any(len(r) + params.max_tokens > 64 for r in rows):
            raise ValueError("the engine refused the whole call")
        batches.append(rows)
        return [Completion([r[0]], [-0.1], "stop", 3) for r in rows]

    co = Coalescer(engine, ContextBudget(64))

    async def go():
        return await asyncio.gather(co.sample([SHORT, LONG, OTHER], SampleParams(max_tokens=8), n=2),
                                    co.sample([[9] * 5], SampleParams(max_tokens=8)))

    mixed, single = asyncio.run(go())
    assert [[c.token_ids for c in g] for g in (mixed[0], mixed[2])] == [[[5], [5]], [[7], [7]]]
    _overflowed(mixed[1], 2, 64)
    assert mixed[1][0].policy_version == 3  # the version the call's served rows were sampled under
    assert single[0][0].token_ids == [9]
    assert len(batches) == 1 and sorted(r[0] for r in batches[0]) == [5, 5, 7, 7, 9]


def test_under_truncate_the_rows_that_fit_share_the_cut():
    seen: list[int] = []

    async def engine(rows, params):
        seen.append(params.max_tokens)
        return [Completion([1], [-0.1], "length", 0) for _ in rows]

    co = Coalescer(engine, ContextBudget(100, overflow="truncate", min_new_tokens=16))
    out = asyncio.run(co.sample([[1] * 10, [2] * 90, [3] * 50], SampleParams(max_tokens=64)))
    assert seen == [50]  # cut to what the longest row that fits leaves
    assert out[1][0].finish_reason == "context_overflow" and "90 tokens" in (out[1][0].error or "")
    assert out[0][0].finish_reason == out[2][0].finish_reason == "length"


def test_the_openai_client_sends_only_the_rows_that_fit(monkeypatch):
    sent: list[list[list[int]]] = []

    async def chunk(self, prompts, params, n):
        sent.append(prompts)
        return [[Completion([p[0]], [-0.1], "stop", 0) for _ in range(n)] for p in prompts]

    monkeypatch.setattr(OpenAISampler, "_sample_chunk", chunk)
    s = OpenAISampler("http://127.0.0.1:9", model="m", context=ContextBudget(64), timeout_s=1, max_retries=0)
    out = asyncio.run(s.sample([SHORT, LONG, OTHER], SampleParams(max_tokens=8), n=2))
    assert sent == [[SHORT, OTHER]]
    assert [g[0].token_ids for g in (out[0], out[2])] == [[5], [7]]
    _overflowed(out[1], 2, 64)


def test_the_openai_server_still_refuses_a_request_with_a_prompt_past_the_samplers_context(tiny):
    # The server fits each prompt to the sampler's budget before sampling; one whose sampler keeps a tighter budget
    # of its own (here: the server reads none) still answers the whole request 400, as before, not a choice with
    # no text.
    pytest.importorskip("fastapi")
    import httpx

    from posttrain.sampling.http_serve import serve_in_loop
    from posttrain.sampling.openai_server import create_app

    _, tok = tiny

    class Unbounded:
        context = None  # what the server reads
        policy_version = 0
        inner = ScriptedSampler(tok, ["a"], context=ContextBudget(64))
        decode = inner.decode
        sample = inner.sample

    async def go():
        async with serve_in_loop(create_app(Unbounded(), tok)) as srv:
            async with httpx.AsyncClient(base_url=srv.url, timeout=30) as h:
                bad = await h.post("/v1/completions", json={"prompt": [SHORT, LONG], "max_tokens": 8})
                ok = await h.post("/v1/completions", json={"prompt": [SHORT, OTHER], "max_tokens": 8})
                return bad, ok

    bad, ok = asyncio.run(asyncio.wait_for(go(), 60))
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "context_length_exceeded", bad.text
    assert "context of 64 tokens" in bad.json()["error"]["message"]
    assert ok.status_code == 200 and len(ok.json()["choices"]) == 2


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(1, 120), min_size=1, max_size=8), st.integers(1, 60), st.integers(1, 3),
       st.sampled_from(["fail", "truncate"]))
def test_each_row_fits_alone_or_fails_alone(lengths, max_tokens, n, overflow):
    # Whatever the mix: a row is served iff it fits on its own, its results are its own (in order), what is served
    # fits the context, and a call raises only when it has one prompt or none fits.
    budget = ContextBudget(100, overflow=overflow)
    prompts = [[i + 1] * length for i, length in enumerate(lengths)]
    fits = []
    for p in prompts:
        try:
            budget.fit(len(p), max_tokens)
            fits.append(True)
        except ContextOverflow:
            fits.append(False)

    async def engine(rows, params):
        assert all(len(r) + params.max_tokens <= 100 for r in rows)
        return [Completion([r[0]] * params.max_tokens, [-0.1] * params.max_tokens, "length", 0) for r in rows]

    try:
        out = asyncio.run(Coalescer(engine, budget).sample(prompts, SampleParams(max_tokens=max_tokens), n=n))
    except ContextOverflow:
        assert len(prompts) == 1 or not any(fits)
        assert not all(fits)
        return
    assert any(fits) and len(out) == len(prompts)
    for i, (group, ok) in enumerate(zip(out, fits)):
        assert len(group) == n
        for c in group:
            if ok:
                assert c.token_ids and set(c.token_ids) == {i + 1} and len(prompts[i]) + len(c.token_ids) <= 100
            else:
                assert c.finish_reason == "context_overflow" and not c.token_ids and c.error
