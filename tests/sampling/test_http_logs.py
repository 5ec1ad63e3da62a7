"""What `posttrain serve` writes to its logs (sampling/http_logs.py, on every server sampling/http_serve.py starts):
an API key never lands there, neither one a
client put in the query string (`?api_key=...`: refused, 401, and logged by uvicorn's access log as sent) nor the
one in its Authorization header, at any log level, trace included.

The server runs as the CLI runs it: `run_forever` (uvicorn's own log config, access log on), here on 127.0.0.1 port 0
in a thread (so uvicorn installs no signal handlers), stopped at the end of each test."""

from __future__ import annotations

import logging
import threading
import time

import pytest

uvicorn = pytest.importorskip("uvicorn")
import httpx

from posttrain.sampling.http_serve import HttpGuard, run_forever

KEY = "header-key-0123456789"
QUERY_SECRET = "query-secret-9876"
LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi")


async def _ok(scope, receive, send):
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": b"{}"})


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.NOTSET)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(self.format(record))


def _serve_and_log(monkeypatch, log_level: str) -> list[str]:
    """Start `run_forever` as `posttrain serve --api-key KEY` does, send requests with the key in the query string
    and in the header, and return every line the uvicorn loggers wrote."""
    saved = {n: (lg.handlers[:], lg.filters[:], lg.level, lg.propagate, lg.disabled)
             for n in LOGGERS for lg in [logging.getLogger(n)]}
    servers: list = []

    class Recorded(uvicorn.Server):
        def __init__(self, config):
            super().__init__(config)
            servers.append(self)

    monkeypatch.setattr(uvicorn, "Server", Recorded)
    thread = threading.Thread(target=run_forever, args=(_ok, "127.0.0.1", 0, log_level, HttpGuard(api_key=KEY)),
                              daemon=True)
    thread.start()
    seen = _Lines()
    try:
        deadline = time.monotonic() + 30
        while not (servers and servers[0].started):
            assert thread.is_alive() and time.monotonic() < deadline, "the server did not start within 30 s"
            time.sleep(0.02)
        for n in LOGGERS:  # after uvicorn's dictConfig, which drops the handlers a logger had
            logging.getLogger(n).addHandler(seen)
        port = servers[0].servers[0].sockets[0].getsockname()[1]
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as h:
            assert h.get(f"/v1/models?api_key={QUERY_SECRET}").status_code == 401
            assert h.get(f"/health?api_key={QUERY_SECRET}&x=1").status_code == 200
            ok = h.get(f"/v1/models?api_key={QUERY_SECRET}", headers={"Authorization": f"Bearer {KEY}"})
            assert ok.status_code == 200
    finally:
        if servers:
            servers[0].should_exit = True
        thread.join(15)
        for n, (handlers, filters, level, propagate, disabled) in saved.items():
            lg = logging.getLogger(n)
            lg.handlers[:], lg.filters[:], lg.level, lg.propagate, lg.disabled = (
                handlers, filters, level, propagate, disabled)
    assert not thread.is_alive(), "the server did not stop within 15 s"
    return seen.lines


def test_the_access_log_shows_no_query_string_and_no_key(monkeypatch):
    lines = _serve_and_log(monkeypatch, "info")
    access = [ln for ln in lines if '"GET /' in ln]
    assert len(access) == 3, lines  # the requests are logged: a test that can see a key if one were there
    assert any("/v1/models" in ln and "401" in ln for ln in access), access
    assert not any(QUERY_SECRET in ln or KEY in ln for ln in lines), lines
    assert not any("?" in ln for ln in access), access  # the path without its query


def test_no_key_at_trace_level(monkeypatch):
    # uvicorn's trace level logs each request's scope (its query string; headers it shows as "<...>")
    lines = _serve_and_log(monkeypatch, "trace")
    assert any("scope=" in ln for ln in lines), lines[:20]
    assert not any(QUERY_SECRET in ln or KEY in ln for ln in lines), [ln for ln in lines if "secret" in ln]
