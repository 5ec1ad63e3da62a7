"""The OpenEnv server (`posttrain env serve`, envs/openenv_server.py) against hostile clients: oversized frames and
bodies, huge actions, bad row choices, slow clients, and the API key. Every refusal is fast (a 4xx, an error
message, or a close frame), /health keeps answering, and memory stays bounded.

The server runs in process (serve_in_loop on 127.0.0.1, port 0), in the test's own event loop, and stops at the
end of each test; every request and receive has a timeout.
"""

from __future__ import annotations

import asyncio
import json
import math
import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("websockets")
import httpx
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from posttrain.envs.openenv_server import create_task_app
from posttrain.envs.task import Task
from posttrain.rewards.rubric import Rubric
from posttrain.sampling.http_serve import serve_in_loop

KEY = "env-key-0123456789"
REPLY_BOUND_S = 5.0  # target < 1 s; measured times are printed with -s
HEALTH_BOUND_S = 1.0
RSS_BOUND = 500 * 2**20
TIMES: dict[str, str] = {}


@pytest.fixture(scope="module", autouse=True)
def _report():
    yield
    if TIMES:
        print("\n\nmeasured (outcome, seconds, worst /health, RSS growth of this process):")
        for k, v in TIMES.items():
            print(f"  {k:32s} {v}")


def _task() -> Task:
    def says_yes(completions, **kw):
        return [1.0 if "yes" in c else 0.0 for c in completions]

    rows = [{"prompt": "Is the sky blue?"}, {"prompt": "Is water wet?"}]
    return Task("yes", rows, rows[:1], Rubric.from_funcs([says_yes]))


def _rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


async def _poll_health(url: str, stop: asyncio.Event, out: list[float]) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=5.0) as h:
        for _ in range(10_000):
            if stop.is_set():
                return
            t = time.perf_counter()
            try:
                ok = (await h.get("/health")).status_code == 200
            except httpx.HTTPError:
                ok = False
            out.append(time.perf_counter() - t if ok else math.inf)
            await asyncio.sleep(0.1)


async def _watched(name: str, url: str, coro_fn):
    """Run `coro_fn()` with /health polled and this process's RSS sampled; returns (result, seconds)."""
    stop, health, peak = asyncio.Event(), [], [_rss()]
    base = peak[0]

    async def sample_rss():
        while not stop.is_set():
            peak[0] = max(peak[0], _rss())
            await asyncio.sleep(0.05)

    tasks = [asyncio.create_task(_poll_health(url, stop, health)), asyncio.create_task(sample_rss())]
    await asyncio.sleep(0.15)
    t = time.perf_counter()
    result = await asyncio.wait_for(coro_fn(), 60)
    seconds = time.perf_counter() - t
    await asyncio.sleep(0.3)
    stop.set()
    await asyncio.wait_for(asyncio.gather(*tasks), 10)
    growth = peak[0] - base
    TIMES[name] = f"{str(result)[:60]}, {seconds:.3f} s, {max(health, default=0):.3f} s, {growth / 2**20:.0f} MB"
    assert seconds < REPLY_BOUND_S, f"{name}: {seconds:.2f}s"
    assert health and max(health) < HEALTH_BOUND_S, f"{name}: /health {health}"
    assert growth < RSS_BOUND, f"{name}: RSS grew by {growth / 2**20:.0f} MB"
    return result


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 120))


def _app(tiny):
    _, tok = tiny
    return create_task_app(_task(), tok, action_timeout_s=10)


def _ws_url(url: str) -> str:
    return url.replace("http://", "ws://") + "/ws"


# ------------------------------------------------------------------------------------------------ websocket

async def _ws_exchange(url: str, messages: list[str], headers=None) -> list:
    """Send each message, collect each reply (a dict) or how the connection closed ('closed <code>')."""
    out: list = []
    async with connect(_ws_url(url), max_size=None, additional_headers=headers, open_timeout=10,
                       close_timeout=2) as ws:
        for m in messages:
            try:
                await ws.send(m)
                out.append(json.loads(await asyncio.wait_for(ws.recv(), 10)))
            except ConnectionClosed as e:
                out.append(f"closed {e.rcvd.code if e.rcvd else None}")
                break
    return out


def test_ws_frame_past_the_cap_closes_with_1009(tiny) -> None:
    app = _app(tiny)

    async def go():
        async with serve_in_loop(app) as srv:
            big = json.dumps({"type": "step", "data": {"message": "a" * 4_000_000}})
            replies = await _watched("ws frame 4 MB", srv.url, lambda: _ws_exchange(srv.url, [big]))
            after = await _ws_exchange(srv.url, [json.dumps({"type": "reset", "data": {"index": 0}})])
            return replies, after

    replies, after = run(go())
    assert replies == ["closed 1009"], replies
    assert after[0]["type"] == "observation", after  # the server goes on serving


def test_ws_action_text_past_the_cap_is_an_error_reply(tiny) -> None:
    app = _app(tiny)

    async def go():
        async with serve_in_loop(app) as srv:
            msgs = [json.dumps({"type": "reset", "data": {"index": 0}}),
                    json.dumps({"type": "step", "data": {"message": "a" * 500_000}}),
                    json.dumps({"type": "step", "data": {"message": "yes"}})]
            return await _watched("ws action 500k chars", srv.url, lambda: _ws_exchange(srv.url, msgs))

    reset, big, ok = run(go())
    assert big["type"] == "error" and big["data"]["code"] == "VALIDATION_ERROR", big
    assert "characters" in big["data"]["message"], big
    assert ok["type"] == "observation" and ok["data"]["done"] is True and ok["data"]["reward"] == 1.0, ok


@pytest.mark.parametrize("data", ['{"split": "bogus"}', '{"index": "nan"}', '{"seed": [1]}', '{"seed": Infinity}',
                                  '{"index": ' + "9" * 5000 + "}", "7"])
def test_ws_bad_row_choice_is_an_error_reply(tiny, data) -> None:
    app = _app(tiny)

    async def go():
        async with serve_in_loop(app) as srv:
            raw = '{"type": "reset", "data": %s}' % data
            return await _ws_exchange(srv.url, [raw, json.dumps({"type": "reset", "data": {"index": 1}})])

    bad, good = run(go())
    assert bad["type"] == "error" and bad["data"]["code"] in ("VALIDATION_ERROR", "INVALID_JSON"), bad
    assert good["type"] == "observation", good


# ------------------------------------------------------------------------------------------------ HTTP routes

HTTP_CASES = {  # name -> (path, raw body, expected statuses)
    "step action 20 MB": ("/step", json.dumps({"action": {"message": "a" * 20_000_000}}).encode(), {413}),
    "step action 500k chars": ("/step", json.dumps({"action": {"message": "a" * 500_000}}).encode(), {400, 422}),
    "reset bad split": ("/reset", b'{"split": "bogus"}', {400, 422}),
    "reset seed Infinity": ("/reset", b'{"seed": Infinity}', {400, 422}),
    "reset seed NaN": ("/reset", b'{"seed": NaN}', {400, 422}),
    "reset index list": ("/reset", b'{"index": [1, 2]}', {400, 422}),
    "step bad split": ("/step", b'{"action": {"message": "yes"}, "split": "x"}', {400, 422}),
    "reset 5000-digit index": ("/reset", b'{"index": ' + b"9" * 5000 + b"}", {400, 422}),
}


@pytest.mark.parametrize("name", list(HTTP_CASES))
def test_http_hostile_request_gets_a_fast_4xx(tiny, name) -> None:
    path, raw, statuses = HTTP_CASES[name]
    app = _app(tiny)

    async def go():
        async with serve_in_loop(app) as srv:
            async def send():
                async with httpx.AsyncClient(base_url=srv.url, timeout=30) as h:
                    r = await h.post(path, content=raw, headers={"content-type": "application/json"})
                return r.status_code, r.text[:300]

            result = await _watched(f"http {name}", srv.url, send)
            async with httpx.AsyncClient(base_url=srv.url, timeout=30) as h:
                ok = await h.post("/step", json={"action": {"message": "yes"}, "index": 0})
            return result, ok

    (status, text), ok = run(go())
    assert status in statuses, (name, status, text)
    assert ok.status_code == 200 and ok.json()["reward"] == 1.0, ok.text


# ------------------------------------------------------------------------------------------------ slow clients, key

def test_slowloris_headers_are_cut_off(tiny) -> None:
    from posttrain.sampling.http_serve import HttpGuard

    app = _app(tiny)

    async def go():
        async with serve_in_loop(app, guard=HttpGuard(header_timeout_s=1.0)) as srv:
            reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
            t = time.perf_counter()
            writer.write(b"GET /ws HTTP/1.1\r\nHost: x\r\n")
            closed = None
            for b in b"X-Slow: " + b"a" * 100:  # 20 s at most
                try:
                    writer.write(bytes([b]))
                    await writer.drain()
                    if await asyncio.wait_for(reader.read(100), 0.2) == b"":
                        closed = time.perf_counter() - t
                        break
                except asyncio.TimeoutError:
                    continue
                except ConnectionError:
                    closed = time.perf_counter() - t
                    break
            writer.close()
            return closed

    closed = run(go())
    TIMES["slowloris headers (timeout 1 s)"] = f"closed after {closed}"
    assert closed is not None and closed < 1 + 3, closed


def test_api_key_guards_http_and_websocket(tiny) -> None:
    from posttrain.sampling.http_serve import HttpGuard

    app = _app(tiny)
    auth = {"Authorization": f"Bearer {KEY}"}

    async def go():
        async with serve_in_loop(app, guard=HttpGuard(api_key=KEY)) as srv:
            async with httpx.AsyncClient(base_url=srv.url, timeout=30) as h:
                no_key = await h.post("/reset", json={"index": 0})
                wrong = await h.post("/reset", json={"index": 0}, headers={"Authorization": "Bearer x"})
                health = await h.get("/health")
                right = await h.post("/reset", json={"index": 0}, headers=auth)
            refused = []
            for headers in (None, {"Authorization": "Bearer x"}):
                try:
                    await _ws_exchange(srv.url, [json.dumps({"type": "reset"})], headers)
                    refused.append(None)
                except InvalidStatus as e:
                    refused.append(e.response.status_code)
            ok = await _ws_exchange(srv.url, [json.dumps({"type": "reset", "data": {"index": 0}})], auth)
            return no_key, wrong, health, right, refused, ok

    no_key, wrong, health, right, refused, ok = run(go())
    assert no_key.status_code == 401 and wrong.status_code == 401, (no_key.text, wrong.text)
    assert "API key" in no_key.json()["detail"]
    assert health.status_code == 200 and right.status_code == 200, right.text
    assert refused == [403, 403], refused
    assert ok[0]["type"] == "observation", ok


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3"])
def test_env_serve_on_a_non_loopback_host_needs_a_key(monkeypatch, host) -> None:
    """`posttrain env serve` refuses before loading the task or binding (both replaced here by failures)."""
    from typer.testing import CliRunner

    import posttrain.cli.serve_cmds as serve_cmds
    import posttrain.sampling.http_serve as http_serve
    from posttrain.cli import app

    def must_not_run(*a, **k):
        raise AssertionError("went on to load the task or bind")

    monkeypatch.delenv("POSTTRAIN_API_KEY", raising=False)
    monkeypatch.setattr(http_serve, "run_forever", must_not_run)
    monkeypatch.setattr(serve_cmds, "build_task_app", must_not_run)
    r = CliRunner().invoke(app, ["env", "serve", "--task", "count-a", "--host", host, "--model", "tiny-random"])
    assert r.exit_code != 0 and not isinstance(r.exception, AssertionError), (r.output, r.exception)
    assert "API key" in r.output and "POSTTRAIN_API_KEY" in r.output, r.output
