"""Run an ASGI app with uvicorn inside the current event loop (in-process servers) or in the foreground (CLI),
behind the same guard in both: size and time limits on what a client sends, and an optional API key.

`serve_in_loop` is what AgentEnv and the tests use: the server shares the caller's event loop, so concurrent
agent calls reach the sampler in the same loop turn and are batched together, and no thread is needed. It
binds port 0 by default (the OS picks a free port, so there is no race) and never installs signal handlers
(Ctrl-C keeps meaning "stop the training run", not "stop this helper server").

The guard (`HttpGuard`, every server started here has one; the defaults hold without a key):

    request headers     at most `max_header_bytes` (URL + header lines), all of them within `header_timeout_s`
                        of the connection opening or the previous response ending; else the connection is closed
    request body        refused from its Content-Length alone when that is past `max_body_bytes` (413, before a
                        byte of it is read), counted while read otherwise (chunked bodies: 413 at the cap), and
                        read whole within `body_timeout_s` (408), before the app sees the request
    WebSocket messages  at most `ws_max_bytes` a message (the websockets library's `max_size`: close code 1009)
    API key             with `api_key` set, every request but `/health` needs `Authorization: Bearer <key>`
                        (401; a WebSocket handshake without it is refused, 403); compared in constant time
    logs                no query string in uvicorn's lines (sampling/http_logs.py): a key sent as `?api_key=...`
                        is refused and never logged; header values are never logged

`check_bind(host, api_key)`: a server reachable from other machines needs a key. The CLI (`posttrain serve`,
`posttrain env serve`) and `run_forever` refuse a non-loopback host without one; the key comes from `--api-key`
or the POSTTRAIN_API_KEY environment variable (`api_key_from`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import inspect
import ipaddress
import json
import logging
import os
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from posttrain.errors import MissingExtraError, PosttrainError
from posttrain.sampling.http_logs import no_query_strings_in_logs

log = logging.getLogger(__name__)

API_KEY_ENV = "POSTTRAIN_API_KEY"
OPEN_PATHS = frozenset({"/health"})  # answered without the key: a liveness probe reveals nothing


@dataclass(frozen=True)
class HttpGuard:
    """What one client may send a server, and the key it must show (None: no key)."""

    api_key: str | None = None
    max_body_bytes: int = 4 * 2**20
    max_header_bytes: int = 64 * 2**10
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    ws_max_bytes: int = 2**20  # a WebSocket message; the OpenEnv server's JSON cap (bounded.MAX_JSON_CHARS) too

    def __post_init__(self):
        for name in ("max_body_bytes", "max_header_bytes", "ws_max_bytes"):
            if getattr(self, name) < 1024:
                raise ValueError(f"{name} must be at least 1024 bytes, got {getattr(self, name)}")
        for name in ("header_timeout_s", "body_timeout_s"):
            if not 0 < getattr(self, name) < float("inf"):
                raise ValueError(f"{name} must be a positive number of seconds, got {getattr(self, name)}")
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("the API key is empty")


# ---- binding ------------------------------------------------------------------------------------------------
class UnsafeBind(PosttrainError, ValueError):
    """A server reachable from other machines without an API key."""


def is_loopback(host: str) -> bool:
    """True for an address only this machine can reach: 'localhost', 127.0.0.0/8, ::1. Names are not resolved
    (a name that resolves to a loopback address today may not tomorrow)."""
    h = host.strip().strip("[]").lower()
    if h == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def api_key_from(flag: str | None) -> str | None:
    """The API key: `--api-key`, else the POSTTRAIN_API_KEY environment variable, else None."""
    key = flag if flag is not None else os.environ.get(API_KEY_ENV)
    return key.strip() if key and key.strip() else None


def check_bind(host: str, api_key: str | None) -> None:
    """Raise UnsafeBind when `host` is reachable from other machines and there is no key."""
    if api_key is None and not is_loopback(host):
        raise UnsafeBind(
            f"refusing to serve on {host!r} without an API key: anything that can reach this address could use "
            f"the endpoint. Pass --api-key KEY (or set {API_KEY_ENV}); clients then send 'Authorization: Bearer "
            "KEY' (the openai client's api_key). Or bind 127.0.0.1 (the default) and reach it through an SSH "
            "tunnel."
        )


# ---- the ASGI guard -----------------------------------------------------------------------------------------
def _error_body(status: int, message: str, kind: str, code: str) -> bytes:
    # OpenAI's shape (what the openai client reads) and FastAPI's `detail` (what OpenEnv clients read).
    return json.dumps({"error": {"message": message, "type": kind, "code": code}, "detail": message}).encode()


async def _refuse(
    send: Any, status: int, message: str, kind: str, code: str, close: bool, headers: Sequence[tuple[bytes, bytes]] = ()
) -> None:
    """Answer a request the app never sees. `close`: end the connection afterwards (a client too slow to keep);
    otherwise the server reads and discards what is left of the body (it keeps no byte of it), so the client
    reads this answer instead of a reset connection."""
    body = _error_body(status, message, kind, code)
    hdrs = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *headers]
    if close:
        hdrs.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": hdrs})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class _BodyTooLarge(Exception):
    pass


class GuardedApp:
    """The ASGI app behind `guard`: the key checked, the body read whole (within the size and time caps) before
    `app` is called with it."""

    def __init__(self, app: Any, guard: HttpGuard):
        self.app, self.guard = app, guard
        self._key = guard.api_key.encode() if guard.api_key else None

    def _authorized(self, scope: dict[str, Any]) -> bool:
        if self._key is None or scope.get("path") in OPEN_PATHS:
            return True
        for name, value in scope.get("headers") or ():
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                if scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self._key):
                    return True
        return False

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        kind = scope["type"]
        if kind == "websocket":
            if not self._authorized(scope):
                await receive()  # websocket.connect
                await send({"type": "websocket.close", "code": 1008, "reason": "a valid API key is required"})
                return
            return await self.app(scope, receive, send)
        if kind != "http":
            return await self.app(scope, receive, send)
        if not self._authorized(scope):
            return await _refuse(
                send,
                401,
                "a valid API key is required: send 'Authorization: Bearer <key>'",
                "authentication_error",
                "invalid_api_key",
                close=False,
                headers=[(b"www-authenticate", b"Bearer")],
            )
        cap = self.guard.max_body_bytes
        declared = _content_length(scope)
        if declared == -1:
            return await _refuse(
                send,
                400,
                "the Content-Length header is not a number",
                "invalid_request_error",
                "bad_request",
                close=True,
            )
        if declared is not None and declared > cap:
            return await _refuse(
                send,
                413,
                f"the request body is {declared} bytes; this server takes at most {cap} (--max-body-mb)",
                "invalid_request_error",
                "request_too_large",
                close=False,
            )
        try:
            async with asyncio.timeout(self.guard.body_timeout_s):
                body = await self._read_body(receive, cap)
        except TimeoutError:
            log.info("cut off a client that did not send its request body within %.0fs", self.guard.body_timeout_s)
            return await _refuse(
                send,
                408,
                f"the request body did not arrive within {self.guard.body_timeout_s}s",
                "invalid_request_error",
                "request_timeout",
                close=True,
            )
        except _BodyTooLarge:
            return await _refuse(
                send,
                413,
                f"the request body is larger than this server takes ({cap} bytes; --max-body-mb)",
                "invalid_request_error",
                "request_too_large",
                close=False,
            )
        if body is None:  # the client went away
            return
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: only http.disconnect comes

        await self.app(scope, replay, send)

    @staticmethod
    async def _read_body(receive: Any, cap: int) -> bytes | None:
        parts, size = [], 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return None
            chunk = msg.get("body", b"")
            size += len(chunk)
            if size > cap:
                raise _BodyTooLarge()
            parts.append(chunk)
            if not msg.get("more_body", False):
                return b"".join(parts)


def _content_length(scope: dict[str, Any]) -> int | None:
    """The declared body size; None without the header, -1 when it is not a number."""
    for name, value in scope.get("headers") or ():
        if name == b"content-length":
            v = value.strip()
            return int(v) if v.isdigit() and len(v) < 20 else -1
    return None


def schema_error_message(e: Any, most: int = 5) -> tuple[str, str | None]:
    """What was wrong with a body that does not fit the schema (FastAPI's RequestValidationError `e`), field by
    field, and the first field's name. Unlike FastAPI's own 422, the values are not repeated back: one may be
    megabytes, or a NaN that JSON cannot write (FastAPI's 422 for that became a 500)."""
    parts, param = [], None
    errors = e.errors()
    for err in errors[:most]:
        if err.get("type") == "json_invalid":
            parts.append(f"the body is not valid JSON ({err.get('ctx', {}).get('error', 'JSON decode error')})")
            continue
        loc = [str(x) for x in err.get("loc", ()) if x != "body"]
        param = param or (".".join(loc) or None)
        parts.append(f"{'.'.join(loc) or 'body'}: {err.get('msg', 'invalid')}")
    more = f" (and {len(errors) - most} more)" if len(errors) > most else ""
    return "invalid request: " + "; ".join(parts) + more, param


# ---- the connection guard (headers) -------------------------------------------------------------------------
def _guarded_protocol(guard: HttpGuard) -> type[asyncio.Protocol]:
    """uvicorn's HTTP/1.1 protocol (httptools, or h11 without it) with a deadline on each request's headers and a
    cap on their size. uvicorn has neither of its own: its keep-alive timeout stops at the first byte a client
    sends, so a client that sends one header byte at a time would hold the connection forever."""
    if TYPE_CHECKING:
        # uvicorn types AutoHTTPProtocol as a bare asyncio.Protocol; it is httptools' protocol or h11's, which
        # share the attributes used here (loop, transport, cycle). The parser callbacks are httptools' only, and
        # are overridden only when the base has them.
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as AutoHTTPProtocol
    else:
        from uvicorn.protocols.http.auto import AutoHTTPProtocol

    tick_s = min(1.0, guard.header_timeout_s / 4)

    class Guarded(AutoHTTPProtocol):
        _g_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._g_cycle = getattr(self, "cycle", None)
            self._g_since = self.loop.time()
            self._g_header_bytes = 0
            self._g_timer = self.loop.call_later(tick_s, self._g_tick)

        def connection_lost(self, exc: Exception | None) -> None:
            if self._g_timer is not None:
                self._g_timer.cancel()
                self._g_timer = None
            super().connection_lost(exc)

        def _g_tick(self) -> None:
            """Between requests (no request, or the last one answered) for longer than the header timeout: close.
            A new request seen since the last tick starts the clock again."""
            self._g_timer = None
            transport = self.transport
            if transport is None or transport.is_closing() or transport.get_protocol() is not self:
                return  # closed, or handed over to the WebSocket protocol
            cycle = getattr(self, "cycle", None)
            waiting = cycle is None or cycle.response_complete
            now = self.loop.time()
            if cycle is not self._g_cycle or not waiting:
                self._g_cycle, self._g_since = cycle, now
            elif now - self._g_since > guard.header_timeout_s:
                log.info("closed a connection that sent no complete request within %.0fs", guard.header_timeout_s)
                transport.close()
                return
            self._g_timer = self.loop.call_later(tick_s, self._g_tick)

        # httptools parser callbacks: count the header bytes (h11 has its own cap, max_incomplete_event_size).
        # Raising here makes the parser fail the request: uvicorn answers 400 and closes the connection.
        def _g_count(self, n: int) -> None:
            self._g_header_bytes += n
            if self._g_header_bytes > guard.max_header_bytes:
                raise ValueError(f"request headers past {guard.max_header_bytes} bytes")

        if hasattr(AutoHTTPProtocol, "on_header"):

            def on_message_begin(self) -> None:
                self._g_header_bytes = 0
                super().on_message_begin()

            def on_url(self, url: bytes) -> None:
                self._g_count(len(url))
                super().on_url(url)

            def on_header(self, name: bytes, value: bytes) -> None:
                self._g_count(len(name) + len(value) + 4)
                super().on_header(name, value)

    return Guarded


def uvicorn_config(app: Any, host: str, port: int, log_level: str, guard: HttpGuard, **kwargs: Any) -> Any:
    """A uvicorn Config for `app` behind `guard`: the guarded app and protocol, WebSocket message and queue
    caps, h11's header cap; no query string in its logs. Options this uvicorn does not know are left out (older
    versions)."""
    uvicorn = _uvicorn()
    no_query_strings_in_logs()
    options: dict[str, Any] = dict(
        host=host,
        port=port,
        log_level=log_level,
        http=_guarded_protocol(guard),
        ws_max_size=guard.ws_max_bytes,
        ws_max_queue=4,
        timeout_keep_alive=5,
        h11_max_incomplete_event_size=guard.max_header_bytes,
        **kwargs,
    )
    known = inspect.signature(uvicorn.Config).parameters
    return uvicorn.Config(GuardedApp(app, guard), **{k: v for k, v in options.items() if k in known})


def _uvicorn():
    try:
        import uvicorn
    except ImportError as e:  # pragma: no cover - depends on the install
        raise MissingExtraError("serving needs the 'serve' extra: pip install 'posttrain[serve]'") from e
    return uvicorn


class InLoopServer:
    """A started uvicorn server running as a task in the current loop. `url` is `http://host:port`.
    `guard`: the limits and key (default: HttpGuard(), limits without a key)."""

    def __init__(
        self,
        app: Any,
        host: str = "127.0.0.1",
        port: int = 0,
        log_level: str = "warning",
        guard: HttpGuard | None = None,
    ):
        uvicorn = _uvicorn()

        class _NoSignals(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self):
                yield

            def install_signal_handlers(self) -> None:  # older uvicorn
                pass

        self.guard = guard or HttpGuard()
        if self.guard.api_key is None and not is_loopback(host):
            log.warning("serving on %s without an API key: anything that can reach it can use it", host)
        # No lifespan: the apps served in a loop have no startup or shutdown work, and a run that ends without
        # stop() (asyncio.run cancelling what is left) would log the lifespan task's CancelledError as an error.
        config = uvicorn_config(app, host, port, log_level, self.guard, lifespan="off", access_log=False)
        self.server = _NoSignals(config)
        self.host = host
        self.port = port
        self.task: asyncio.Task | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self, timeout_s: float = 30.0) -> InLoopServer:
        self.loop = asyncio.get_running_loop()
        self.task = asyncio.create_task(self.server.serve())
        deadline = self.loop.time() + timeout_s
        while not self.server.started:
            if self.task.done():  # failed to bind or to start the app
                self.task.result()
                raise RuntimeError("server exited during startup")
            if self.loop.time() > deadline:
                raise TimeoutError(f"server did not start within {timeout_s}s")
            await asyncio.sleep(0.01)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        return self

    async def stop(self, timeout_s: float = 10.0) -> None:
        if self.task is None or self.task.done():
            return
        self.server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(self.task), timeout_s)
        except TimeoutError:
            log.warning("server on %s did not stop within %ss; cancelling it", self.url, timeout_s)
            self.server.force_exit = True
            self.task.cancel()


@contextlib.asynccontextmanager
async def serve_in_loop(
    app: Any, host: str = "127.0.0.1", port: int = 0, guard: HttpGuard | None = None
) -> AsyncIterator[InLoopServer]:
    server = await InLoopServer(app, host, port, guard=guard).start()
    try:
        yield server
    finally:
        await server.stop()


def run_forever(app: Any, host: str, port: int, log_level: str = "info", guard: HttpGuard | None = None) -> None:
    """Foreground server for the CLI (Ctrl-C stops it). Refuses (UnsafeBind) a non-loopback host without a key."""
    guard = guard or HttpGuard()
    check_bind(host, guard.api_key)
    _uvicorn().Server(uvicorn_config(app, host, port, log_level, guard)).run()
