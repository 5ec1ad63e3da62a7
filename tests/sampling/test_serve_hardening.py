"""`posttrain serve` against hostile clients: every refused request gets a 4xx fast, /health keeps answering,
the server's memory stays bounded, slow clients are cut off, and an API key guards everything but /health.

The server is the real one: `posttrain serve --model tiny-random` in a subprocess on 127.0.0.1 (port 0: the OS
picks a free one, read back from uvicorn's startup line). It dies with this process (PR_SET_PDEATHSIG), has an
address-space cap (RLIMIT_AS) and a watchdog timer, and a watcher kills it if its RSS grows past a safety cap, so
a regression cannot take the machine's memory. Every request has a client-side timeout; every loop is bounded.
Run with `-s` to see the measured times and memory.
"""

from __future__ import annotations

import asyncio
import collections
import ctypes
import json
import math
import os
import re
import resource
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
psutil = pytest.importorskip("psutil")
import httpx

KEY = "test-key-0123456789"
START_S = 180.0  # starting a server (imports, the tiny model) on a busy 2-core machine
SERVER_LIFETIME_S = 900.0  # a server is killed after this whatever happens
REPLY_BOUND_S = 5.0  # a refused request must be answered within this (the target is < 1 s; the times are reported)
HEALTH_BOUND_S = 1.0  # each /health poll during a hostile request
RSS_BOUND = 500 * 2**20  # server RSS growth allowed during one hostile request
RSS_KILL = 3 * 2**30  # safety: the watcher kills the server past this growth
CONTEXT = 1024  # tiny-random's positions
CLI = "import sys; sys.argv[0] = 'posttrain'; from posttrain.cli import app; app()"
TIMES: dict[str, str] = {}  # case -> "status, seconds, worst /health, RSS growth": printed at the end


def _child_limits() -> None:  # runs in the child before exec
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the test
    except OSError:
        pass
    resource.setrlimit(resource.RLIMIT_AS, (8 * 2**30, 8 * 2**30))


class Served:
    """A `posttrain` server subprocess; `url` once started."""

    def __init__(self, args: list[str], extra_env: dict[str, str] | None = None):
        env = {k: v for k, v in os.environ.items() if k != "POSTTRAIN_API_KEY"}
        env.update({"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", **(extra_env or {})})
        self.cmd = [sys.executable, "-c", CLI, *args]
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                                     preexec_fn=_child_limits, text=True, errors="replace")
        self.lines: collections.deque[str] = collections.deque(maxlen=200)
        self.port: int | None = None
        self._started = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        self._killer = threading.Timer(SERVER_LIFETIME_S, self.proc.kill)
        self._killer.daemon = True
        self._killer.start()
        if not self._started.wait(START_S) or self.port is None:
            self.stop()
            raise RuntimeError(f"server did not start: {' '.join(args)}\n" + "\n".join(self.lines))
        self.url = f"http://127.0.0.1:{self.port}"

    def _read(self) -> None:
        for line in self.proc.stdout:  # ends when the process does
            self.lines.append(line.rstrip())
            m = re.search(r"Uvicorn running on http://127\.0\.0\.1:(\d+)", line)
            if m:
                self.port = int(m.group(1))
                self._started.set()
        self._started.set()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def rss(self) -> int:
        return psutil.Process(self.proc.pid).memory_info().rss

    def log(self) -> str:
        return "\n".join(list(self.lines)[-30:])

    def stop(self) -> None:
        self._killer.cancel()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(15)


class _Servers:
    """One server per argument list for the module, restarted if a test killed it."""

    def __init__(self):
        self.running: dict[tuple, Served] = {}

    def get(self, *args: str, env: dict[str, str] | None = None) -> Served:
        key = (args, tuple(sorted((env or {}).items())))
        s = self.running.get(key)
        if s is None or not s.alive():
            s = self.running[key] = Served(["serve", "--model", "tiny-random", "--host", "127.0.0.1", "--port", "0",
                                            *args], env)
        return s

    def close(self) -> None:
        for s in self.running.values():
            s.stop()


@pytest.fixture(scope="module")
def servers():
    s = _Servers()
    yield s
    s.close()
    if TIMES:
        print("\n\nmeasured (status, reply seconds, worst /health seconds, server RSS growth):")
        for k, v in TIMES.items():
            print(f"  {k:34s} {v}")


@pytest.fixture
def server(servers) -> Served:
    return servers.get()


# ------------------------------------------------------------------------------------------------ measuring

class RssWatch:
    """Peak RSS of the server while a request runs; kills it past the safety cap."""

    def __init__(self, server: Served):
        self.server, self.base = server, server.rss()
        self.peak, self.killed = self.base, False
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            try:
                rss = self.server.rss()
            except psutil.Error:
                return
            self.peak = max(self.peak, rss)
            if rss - self.base > RSS_KILL:
                self.killed = True
                self.server.proc.kill()
                return

    def stop(self) -> int:
        self._stop.set()
        self._t.join(5)
        return self.peak - self.base


async def _poll_health(url: str, stop: asyncio.Event, out: list[float]) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=5.0) as h:
        for _ in range(10_000):  # bounded; stopped by `stop` long before
            if stop.is_set():
                return
            t = time.perf_counter()
            try:
                ok = (await h.get("/health")).status_code == 200
            except httpx.HTTPError:
                ok = False
            out.append(time.perf_counter() - t if ok else math.inf)
            await asyncio.sleep(0.1)


@dataclass
class Outcome:
    status: int | None
    body: dict
    seconds: float
    health: list[float] = field(default_factory=list)
    rss_growth: int = 0
    error: str = ""

    @property
    def worst_health(self) -> float:
        return max(self.health, default=0.0)


def hostile(server: Served, name: str, send) -> Outcome:
    """Run `send(client) -> httpx.Response` against `server` with /health polled and RSS watched throughout."""

    async def go() -> Outcome:
        stop, health = asyncio.Event(), []
        poller = asyncio.create_task(_poll_health(server.url, stop, health))
        await asyncio.sleep(0.15)  # one poll before
        t = time.perf_counter()
        try:
            async with httpx.AsyncClient(base_url=server.url, timeout=60.0) as h:
                r = await send(h)
            seconds = time.perf_counter() - t
            try:
                body = r.json()
            except ValueError:
                body = {"raw": r.text[:300]}
            out = Outcome(r.status_code, body, seconds)
        except (httpx.HTTPError, OSError) as e:
            out = Outcome(None, {}, time.perf_counter() - t, error=f"{type(e).__name__}: {e}")
        await asyncio.sleep(0.3)  # polls after
        stop.set()
        await asyncio.wait_for(poller, 10)
        out.health = health
        return out

    watch = RssWatch(server)
    try:
        out = asyncio.run(asyncio.wait_for(go(), 120))
    finally:
        out_growth = watch.stop()
    out.rss_growth = out_growth
    TIMES[name] = (f"{out.status}, {out.seconds:.3f} s, {out.worst_health:.3f} s, "
                   f"{out.rss_growth / 2**20:.0f} MB" + (" (killed: RSS cap)" if watch.killed else ""))
    if watch.killed:
        pytest.fail(f"{name}: the server's RSS grew past {RSS_KILL / 2**30:.0f} GiB; killed it")
    return out


def assert_refused(out: Outcome, name: str, statuses=None, code: str | None = None) -> None:
    assert out.status is not None, f"{name}: no HTTP answer ({out.error}) after {out.seconds:.2f}s"
    assert 400 <= out.status < 500, f"{name}: expected a 4xx, got {out.status}: {str(out.body)[:400]}"
    if statuses is not None:
        assert out.status in statuses, f"{name}: expected {statuses}, got {out.status}: {str(out.body)[:400]}"
    if code is not None:
        err = out.body.get("error") or {}
        assert err.get("code") == code and err.get("type") == "invalid_request_error", f"{name}: {out.body}"
    assert out.seconds < REPLY_BOUND_S, f"{name}: answered after {out.seconds:.2f}s"
    assert out.worst_health < HEALTH_BOUND_S, f"{name}: /health took up to {out.worst_health:.2f}s: {out.health}"
    assert out.rss_growth < RSS_BOUND, f"{name}: the server's RSS grew by {out.rss_growth / 2**20:.0f} MB"


# ------------------------------------------------------------------------------------------------ the requests

def chat(**kw) -> dict:
    return {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **kw}


def post_json(path: str, body: dict):
    return lambda h: h.post(path, json=body)


def post_raw(path: str, raw: bytes):
    return lambda h: h.post(path, content=raw, headers={"content-type": "application/json"})


def _chunked_20mb(h: httpx.AsyncClient):
    async def gen():
        yield b'{"messages": [{"role": "user", "content": "'
        for _ in range(20):
            yield b"a" * 2**20
        yield b'"}]}'

    return h.post("/v1/chat/completions", content=gen(), headers={"content-type": "application/json"})


def _nested(depth: int) -> bytes:
    return b'{"messages": [{"role": "user", "content": ' + b"[" * depth + b"]" * depth + b"}]}"


CASES = {  # name -> (send, statuses (None: any 4xx), error code)
    "max_tokens_1e9": (post_json("/v1/chat/completions", chat(max_tokens=10**9)), {400}, "context_length_exceeded"),
    "completions_max_tokens_1e9": (post_json("/v1/completions", {"prompt": "hi", "max_tokens": 10**9}), {400},
                                   "context_length_exceeded"),
    "message_20MB": (post_json("/v1/chat/completions", chat(messages=[{"role": "user", "content": "a" * 20_000_000}])),
                     {413}, None),
    "chunked_body_20MB": (_chunked_20mb, {413}, None),
    "n_1e6": (post_json("/v1/chat/completions", chat(n=10**6)), None, None),
    "completions_n_1e6": (post_json("/v1/completions", {"prompt": "hi", "max_tokens": 2, "n": 10**6}), None, None),
    "temperature_negative": (post_json("/v1/chat/completions", chat(temperature=-1.0)), None, None),
    "temperature_nan": (post_raw("/v1/chat/completions", json.dumps(chat(temperature=math.nan)).encode()), None, None),
    "temperature_inf": (post_raw("/v1/chat/completions", json.dumps(chat(temperature=math.inf)).encode()), None, None),
    "top_p_nan": (post_raw("/v1/chat/completions", json.dumps(chat(top_p=math.nan)).encode()), None, None),
    "stop_list_100k": (post_json("/v1/chat/completions", chat(stop=["stop-word"] * 100_000)), None, None),
    "stop_string_1MB": (post_json("/v1/chat/completions", chat(stop=["s" * 2**20])), None, None),
    "prompt_past_context": (post_json("/v1/chat/completions",
                                      chat(messages=[{"role": "user", "content": "hello " * 1000}], max_tokens=16)),
                            {400}, "context_length_exceeded"),
    "token_ids_past_context": (post_json("/v1/completions", {"prompt": [5] * 5000, "max_tokens": 4}), {400},
                               "context_length_exceeded"),
    "max_tokens_zero": (post_json("/v1/chat/completions", chat(max_tokens=0)), None, None),
    "max_tokens_negative": (post_json("/v1/completions", {"prompt": "hi", "max_tokens": -5}), None, None),
    "seed_2e80": (post_json("/v1/chat/completions", chat(seed=2**80)), None, None),
    "messages_100k": (post_json("/v1/chat/completions", chat(messages=[{"role": "user", "content": "a"}] * 100_000)),
                      None, None),
    "prompts_batch_10k": (post_json("/v1/completions", {"prompt": [[5, 6]] * 10_000, "max_tokens": 2}), None, None),
    "json_nested_100k_deep": (post_raw("/v1/chat/completions", _nested(100_000)), None, None),
    "tools_1MB": (post_json("/v1/chat/completions", chat(tools=[{"type": "function", "function": {
        "name": "f", "description": "d" * 2**20}}])), None, None),
}


@pytest.mark.parametrize("name", list(CASES))
def test_hostile_request_gets_a_fast_4xx(server: Served, name: str) -> None:
    send, statuses, code = CASES[name]
    out = hostile(server, name, send)
    assert_refused(out, name, statuses, code)
    assert server.alive(), server.log()


def test_content_length_past_the_cap_is_refused_before_the_body(server: Served) -> None:
    """A Content-Length of 1 TB with no body sent: refused from the header alone."""

    async def go():
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        t = time.perf_counter()
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000000000000\r\n\r\n")
        await writer.drain()
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), REPLY_BOUND_S)
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, ConnectionError) as e:
            head = f"no answer: {type(e).__name__}".encode()
        seconds = time.perf_counter() - t
        writer.close()
        return head, seconds

    head, seconds = asyncio.run(asyncio.wait_for(go(), 30))
    TIMES["content_length_1TB"] = f"{head[:12].decode(errors='replace')}, {seconds:.3f} s"
    assert head.startswith(b"HTTP/1.1 413"), head[:200]


def test_oversized_headers_are_refused(server: Served) -> None:
    """200 KB of header lines (the cap is 64 KiB): a 400 and the connection closed, without waiting for the rest."""

    async def go():
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        t = time.perf_counter()
        writer.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n")
        try:
            for i in range(200):  # 200 KB, never the blank line that ends the headers
                writer.write(f"X-Filler-{i}: ".encode() + b"a" * 1000 + b"\r\n")
                await writer.drain()
        except ConnectionError:
            pass
        try:
            head = await asyncio.wait_for(reader.read(200), REPLY_BOUND_S)
        except ConnectionError:  # the server closed the connection under our writes: refused, reply unreadable
            head = b""
        except asyncio.TimeoutError as e:
            head = f"no answer: {type(e).__name__}".encode()
        seconds = time.perf_counter() - t
        writer.close()
        return head, seconds

    head, seconds = asyncio.run(asyncio.wait_for(go(), 30))
    TIMES["headers_200KB"] = f"{head[:12].decode(errors='replace')}, {seconds:.3f} s"
    assert head.startswith(b"HTTP/1.1 400") or head == b"", head[:200]
    assert server.alive()


def test_schema_errors_name_the_field_without_echoing_it(server: Served) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as h:
        bad_json = h.post("/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
        nan = h.post("/v1/chat/completions", content=json.dumps(chat(top_p=math.nan, stop=["x"] * 3)).encode(),
                     headers={"content-type": "application/json"})
    assert bad_json.status_code == 422 and "not valid JSON" in bad_json.json()["error"]["message"], bad_json.text
    err = nan.json()["error"]
    assert nan.status_code == 422 and err["param"] == "top_p" and "finite" in err["message"], nan.text
    assert "NaN" not in nan.text


def test_server_still_answers_normal_requests(server: Served) -> None:
    with httpx.Client(base_url=server.url, timeout=60) as h:
        r = h.post("/v1/chat/completions", json=chat(max_tokens=4, n=2, stop=["x"], temperature=0.7, seed=3))
        c = h.post("/v1/completions", json={"prompt": [[5, 6, 7], [8, 9]], "max_tokens": 3, "n": 2})
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"]) == 2
    assert c.status_code == 200 and len(c.json()["choices"]) == 4, c.text


# ------------------------------------------------------------------------------------------------ slow clients

def _slowloris(port: int, first: bytes, drip: bytes, bound_s: float) -> tuple[str, float]:
    """Send `first`, then `drip` one byte every 0.2 s; how the server ended it ('closed', an HTTP status line,
    or 'still open') and after how many seconds."""

    async def go():
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        t = time.perf_counter()
        writer.write(first)
        await writer.drain()
        read = asyncio.ensure_future(reader.read(4096))
        how = "still open"
        for b in drip[: int(bound_s / 0.2)]:
            done, _ = await asyncio.wait({read}, timeout=0.2)
            if done:
                break
            try:
                writer.write(bytes([b]))
                await writer.drain()
            except ConnectionError:
                how = "closed"
                break
        if read.done() or how == "closed":
            try:
                data = await asyncio.wait_for(read, 1)
            except (ConnectionError, asyncio.TimeoutError):
                data = b""
            how = data.split(b"\r\n")[0].decode(errors="replace") if data else "closed"
        else:
            read.cancel()
        seconds = time.perf_counter() - t
        writer.close()
        return how, seconds

    return asyncio.run(asyncio.wait_for(go(), bound_s + 30))


HEADERS = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"


def keyed(servers) -> Served:
    """A server with an API key (from the environment) and short header / body timeouts."""
    return servers.get("--header-timeout", "2", "--body-timeout", "2", env={"POSTTRAIN_API_KEY": KEY})


def test_slowloris_headers_are_cut_off(servers) -> None:
    srv = keyed(servers)
    how, seconds = _slowloris(srv.port, HEADERS, b"X-Slow: " + b"a" * 200, bound_s=15)
    TIMES["slowloris_headers (timeout 2 s)"] = f"{how}, {seconds:.2f} s"
    assert how != "still open" and seconds < 2 + 3, (how, seconds)


def test_slowloris_body_is_cut_off(servers) -> None:
    srv = keyed(servers)
    first = HEADERS + f"Authorization: Bearer {KEY}\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n".encode()
    how, seconds = _slowloris(srv.port, first, b"{" + b" " * 499, bound_s=15)
    TIMES["slowloris_body (timeout 2 s)"] = f"{how}, {seconds:.2f} s"
    assert how != "still open" and seconds < 2 + 3, (how, seconds)
    assert how.startswith("HTTP/1.1 408") or how == "closed", how


def test_default_header_timeout_cuts_off_slowloris(server: Served) -> None:
    how, seconds = _slowloris(server.port, HEADERS, b"X-Slow: " + b"a" * 200, bound_s=25)
    TIMES["slowloris_headers (default)"] = f"{how}, {seconds:.2f} s"
    assert how != "still open" and seconds < 20, (how, seconds)


# ------------------------------------------------------------------------------------------------ the API key

def test_api_key_guards_everything_but_health(servers) -> None:
    srv = keyed(servers)
    body = chat(max_tokens=2)
    with httpx.Client(base_url=srv.url, timeout=60) as h:
        none = h.post("/v1/chat/completions", json=body)
        wrong = h.post("/v1/chat/completions", json=body, headers={"Authorization": "Bearer nope"})
        models = h.get("/v1/models")
        big_no_key = h.post("/v1/chat/completions", json=chat(messages=[{"role": "user", "content": "a" * 2**20}]))
        health = h.get("/health")
        right = h.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY}"})
    for name, r in (("no key", none), ("wrong key", wrong), ("models, no key", models), ("big, no key", big_no_key)):
        assert r.status_code == 401, (name, r.status_code, r.text)
        assert "API key" in r.json()["error"]["message"], r.text
    assert health.status_code == 200
    assert right.status_code == 200, right.text


def test_api_key_flag_works_with_the_openai_client(servers) -> None:
    openai = pytest.importorskip("openai")
    srv = servers.get("--api-key", "flag-key-abc")
    ok = openai.OpenAI(base_url=srv.url + "/v1", api_key="flag-key-abc", timeout=60, max_retries=0)
    bad = openai.OpenAI(base_url=srv.url + "/v1", api_key="other", timeout=60, max_retries=0)
    r = ok.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert r.choices[0].message is not None
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="context_length_exceeded|context"):
        ok.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=10**9)


@pytest.mark.parametrize("command", [["serve"], ["env", "serve", "--task", "count-a"]])
@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.20", "my-host.example"])
def test_non_loopback_bind_without_a_key_is_refused_before_anything_starts(monkeypatch, command, host) -> None:
    """Checked before the model loads and before anything binds: both are replaced here by functions that fail."""
    from typer.testing import CliRunner

    import posttrain.envs.openenv_server as openenv_server
    import posttrain.sampling.http_serve as http_serve
    import posttrain.sampling.openai_server as openai_server
    from posttrain.cli import app

    def must_not_run(*a, **k):
        raise AssertionError("the server went on to load the model or bind")

    monkeypatch.delenv("POSTTRAIN_API_KEY", raising=False)
    monkeypatch.setattr(http_serve, "run_forever", must_not_run)
    monkeypatch.setattr(openai_server, "build_model_app", must_not_run)
    monkeypatch.setattr(openenv_server, "create_task_app", must_not_run)
    r = CliRunner().invoke(app, [*command, "--host", host, "--port", "1", "--model", "tiny-random"])
    assert r.exit_code != 0
    assert not isinstance(r.exception, AssertionError), r.exception
    out = r.output
    assert "API key" in out and "--api-key" in out and "POSTTRAIN_API_KEY" in out, out


def test_bind_check() -> None:
    from posttrain.sampling.http_serve import UnsafeBind, check_bind, is_loopback

    for host in ("127.0.0.1", "127.0.0.2", "localhost", "::1", "[::1]"):
        assert is_loopback(host), host
        check_bind(host, None)
    for host in ("0.0.0.0", "", "::", "10.0.0.1", "example.com", "127.0.0.1.example.com"):
        assert not is_loopback(host), host
        with pytest.raises(UnsafeBind, match="POSTTRAIN_API_KEY"):
            check_bind(host, None)
        check_bind(host, "a-key")


# ------------------------------------------------------------------------------------------------ in process

class SlowTokenizer:
    """The tiny tokenizer, each encode taking `delay_s` (sleeping, as the Rust tokenizer releases the GIL)."""

    def __init__(self, tok, delay_s: float):
        self._tok, self.delay_s = tok, delay_s

    def __call__(self, *a, **k):
        time.sleep(self.delay_s)
        return self._tok(*a, **k)

    def __len__(self):
        return len(self._tok)

    def __getattr__(self, name):
        return getattr(self._tok, name)


def test_tokenizing_runs_off_the_event_loop(tiny) -> None:
    """While a request's prompt is tokenized (slow here), /health answers within its bound."""
    from posttrain.models import stop_token_ids
    from posttrain.sampling import HFSampler
    from posttrain.sampling.http_serve import serve_in_loop
    from posttrain.sampling.openai_server import create_app

    model, tok = tiny
    slow = SlowTokenizer(tok, 2.0)
    app = create_app(HFSampler(model, tok, stop_token_ids(model, tok), seed=0), slow, model_name="tiny")

    async def go():
        async with serve_in_loop(app) as srv:
            stop, health = asyncio.Event(), []
            poller = asyncio.create_task(_poll_health(srv.url, stop, health))
            async with httpx.AsyncClient(base_url=srv.url, timeout=60) as h:
                chat_r = await h.post("/v1/chat/completions", json=chat(max_tokens=2))
                text_r = await h.post("/v1/completions", json={"prompt": "hello", "max_tokens": 2})
            stop.set()
            await asyncio.wait_for(poller, 10)
            return chat_r, text_r, health

    chat_r, text_r, health = asyncio.run(asyncio.wait_for(go(), 120))
    assert chat_r.status_code == 200 and text_r.status_code == 200, (chat_r.text, text_r.text)
    TIMES["slow tokenizer: worst /health"] = f"{max(health):.3f} s over {len(health)} polls"
    assert len(health) >= 10 and max(health) < HEALTH_BOUND_S, health


def test_truncate_overflow_cuts_max_tokens(tiny) -> None:
    """With `context.overflow == "truncate"` a max_tokens past the context is cut to what the prompt leaves."""
    from posttrain.models import stop_token_ids
    from posttrain.sampling import HFSampler
    from posttrain.sampling.context import ContextBudget
    from posttrain.sampling.http_serve import serve_in_loop
    from posttrain.sampling.openai_server import create_app

    model, tok = tiny
    sampler = HFSampler(model, tok, [], seed=0, context=ContextBudget(CONTEXT, "truncate"))
    app = create_app(sampler, tok, model_name="tiny")
    prompt = [5] * (CONTEXT - 20)

    async def go():
        async with serve_in_loop(app) as srv:
            async with httpx.AsyncClient(base_url=srv.url, timeout=60) as h:
                cut = await h.post("/v1/completions", json={"prompt": prompt, "max_tokens": 10**9})
                full = await h.post("/v1/completions", json={"prompt": [5] * (CONTEXT - 2), "max_tokens": 10**9})
            return cut, full

    cut, full = asyncio.run(asyncio.wait_for(go(), 120))
    assert cut.status_code == 200, cut.text
    usage = cut.json()["usage"]
    assert usage["prompt_tokens"] == CONTEXT - 20 and usage["completion_tokens"] <= 20, usage
    # 2 positions left: fewer than the budget's min_new_tokens, so even truncate refuses
    assert full.status_code == 400 and full.json()["error"]["code"] == "context_length_exceeded", full.text
