"""Run an ASGI app with uvicorn inside the current event loop (in-process servers) or in the foreground (CLI).

`serve_in_loop` is what AgentEnv and the tests use: the server shares the caller's event loop, so concurrent
agent calls reach the sampler in the same loop turn and are batched together, and no thread is needed. It
binds port 0 by default (the OS picks a free port, so there is no race) and never installs signal handlers
(Ctrl-C keeps meaning "stop the training run", not "stop this helper server").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

log = logging.getLogger(__name__)


def _uvicorn():
    try:
        import uvicorn
    except ImportError as e:  # pragma: no cover - depends on the install
        raise ImportError("serving needs the 'serve' extra: pip install 'posttrain[serve]'") from e
    return uvicorn


class InLoopServer:
    """A started uvicorn server running as a task in the current loop. `url` is `http://host:port`."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning"):
        uvicorn = _uvicorn()

        class _NoSignals(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self):
                yield

            def install_signal_handlers(self) -> None:  # older uvicorn
                pass

        config = uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on", access_log=False)
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
        except asyncio.TimeoutError:
            log.warning("server on %s did not stop within %ss; cancelling it", self.url, timeout_s)
            self.server.force_exit = True
            self.task.cancel()


@contextlib.asynccontextmanager
async def serve_in_loop(app: Any, host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[InLoopServer]:
    server = await InLoopServer(app, host, port).start()
    try:
        yield server
    finally:
        await server.stop()


def run_forever(app: Any, host: str, port: int, log_level: str = "info") -> None:
    """Foreground server for the CLI (Ctrl-C stops it)."""
    _uvicorn().run(app, host=host, port=port, log_level=log_level)
