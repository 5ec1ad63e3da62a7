"""A rollout's own base URL (`/rollouts/<id>/v1`): a framework that builds its own client from a base URL is
recorded under its episode with only `base_url` changed; bad rollout paths are refused alone."""

import asyncio

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
import httpx
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.sampling.http_serve import serve_in_loop
from posttrain.sampling.openai_server import create_app
from posttrain.sampling.rollout_paths import MAX_ID_CHARS, rollout_base_url
from posttrain.sampling.scripted import ScriptedSampler


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


@pytest.fixture
def app(tiny):
    _, tok = tiny
    return create_app(ScriptedSampler(tok, ["fine"]), tok, model_name="tiny")


MSGS = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("rid", ["r1", "ep/seat-2", "a b%c", "x" * MAX_ID_CHARS])
def test_a_client_built_from_the_base_url_alone_is_recorded_under_its_rollout(app, rid):
    async def go():
        async with serve_in_loop(app) as srv:
            # a header the client sends too is overridden: the path is what AgentEnv handed out
            client = openai.AsyncOpenAI(base_url=rollout_base_url(srv.url, rid), api_key="x", max_retries=0,
                                        timeout=30, default_headers={"X-Rollout-Id": "other"})
            await client.chat.completions.create(model="tiny", messages=MSGS, max_tokens=4)
            await client.completions.create(model="tiny", prompt="hello", max_tokens=4)
            await client.responses.create(model="tiny", input="hi", max_output_tokens=4)
            models = await client.models.list()
            await client.close()
            return models

    models = run(go())
    assert [m.id for m in models.data] == ["tiny"]
    assert len(app.state.recorder.pop(rid).calls) == 3
    assert app.state.recorder.pop("other").calls == []


@pytest.mark.parametrize(
    "path",
    ["/rollouts/", "/rollouts/r1", "/rollouts//v1/models", "/rollouts/" + "x" * (MAX_ID_CHARS + 1) + "/v1/models",
     "/rollouts/%0A/v1/models", "/rollouts/%C3%A9/v1/models"],
)
def test_a_bad_rollout_path_is_a_404_in_openai_shape_and_the_server_keeps_serving(app, path):
    async def go():
        async with serve_in_loop(app) as srv, httpx.AsyncClient(base_url=srv.url, timeout=30) as http:
            bad = await http.get(path)
            ok = await http.get("/v1/models")
            return bad, ok

    bad, ok = run(go())
    assert bad.status_code == 404 and bad.json()["error"]["code"] == "not_found"
    assert ok.status_code == 200


_APP: list = []


def _shared_app():
    """One app for every example (the recorder is popped per id)."""
    if not _APP:
        from posttrain.models.tiny import tiny_tokenizer

        tok = tiny_tokenizer()
        _APP.append(create_app(ScriptedSampler(tok, ["ok"]), tok, model_name="tiny"))
    return _APP[0]


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=300))
def test_any_rollout_id_round_trips_or_is_refused_alone(rid):
    """Whatever a caller puts in the id, the request is recorded under exactly that id or answered 404."""
    app = _shared_app()
    valid = rid not in (".", "..") and bool(rid) and rid.isascii() and rid.isprintable() and len(rid) <= MAX_ID_CHARS
    if not valid:  # the URL is never built: the client side refuses it as the server would
        with pytest.raises(ValueError, match="not a rollout id"):
            rollout_base_url("http://t", rid)
        return

    async def go():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, timeout=30) as http:
            return await http.post(rollout_base_url("http://t", rid) + "/completions",
                                   json={"model": "tiny", "prompt": "a", "max_tokens": 2})

    r = run(go())
    assert r.status_code == 200, r.text
    assert len(app.state.recorder.pop(rid).calls) == 1
