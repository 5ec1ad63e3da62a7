"""Where a VLLMServerPool's servers listen (cluster/vllm_servers.py): Unix sockets in a directory of the pool's own,
and the HTTP transports this process reaches them through.

    sockets = SocketDir.create()          a new directory, mode 0700 (dead owners' directories swept first)
    sockets.socket_for(rank, incarnation) the path a server binds (`--uds`): s<rank>-<incarnation>.sock
    url_of(path)                          http://s0-1.sock: the URL's host names the socket
    SocketRoutes(sockets.path)            an httpx transport sending each request to the socket its host names
    AsyncSocketRoutes(sockets.path)       the same for an httpx.AsyncClient
    sockets.remove()                      the directory and all in it

Why not TCP on 127.0.0.1: every local process can reach a loopback port, and vLLM's `--api-key` guards only the
routes under /v1, /v2, /inference and /cohere (vllm/entrypoints/serve/middleware/authenticate.py GUARDED_PREFIX):
/collective_rpc (a `reload_weights` from a folder of the caller's choosing, the worker extension's load from a
block it names, a join of a weight group it invites the server to), /pause, /update_weight_version and the rest
answer anyone. A Unix socket in a directory only this user may enter answers only this user's processes, on every
route, with no key to leak (a key in the environment is readable in /proc by the same processes that could enter the
directory).

The directory is also each server's TMPDIR and VLLM_RPC_BASE_PATH (vllm_server_launch.py), so vLLM's own sockets
between its API server, engine core and worker (ZMQ over ipc://) and its rendezvous file land in it too, not in /tmp.

Every directory:
- is named `posttrain-vllm-<owner pid>-<pid namespace tag>-<random>` in the temporary directory (or /tmp where
  that path is too long for a socket address: 107 bytes with vLLM's 36-character names under it);
- is removed by its owner at `remove()` (the pool's close), when the owner object is collected and at interpreter
  exit (a finalizer), never by a forked child of the owner; by the servers' watchdog when the owner disappears
  (server_processes.py); and otherwise by the next `create` on the host, which removes every directory of this pid
  namespace whose owner is no longer alive (posttrain/owned.py).
"""

from __future__ import annotations

import contextlib
import re
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

import httpx

from posttrain.owned import OwnedDir, sweep_dirs

PREFIX = "posttrain-vllm-"
_SOCKET = re.compile(r"s\d{1,6}-\d{1,6}\.sock")
# sun_path holds 108 bytes with its NUL; vLLM puts `<uuid4>` (36) under its VLLM_RPC_BASE_PATH, which is this dir
_MAX_DIR = 107 - 1 - 36
T = TypeVar("T")


class SocketDir:
    """A pool's private directory of server sockets (module docstring)."""

    def __init__(self, owned: OwnedDir):
        self.owned, self.path = owned, owned.path

    @classmethod
    def create(cls, base: str | None = None) -> SocketDir:
        """A new directory, mode 0700, owned by this user; the directories of dead owners swept first."""
        base = base or tempfile.gettempdir()
        name_len = len(PREFIX) + 10 + 1 + 6 + 1 + 8  # the longest name OwnedDir gives: <pid>-<ns tag>-<random>
        if len(base) + 1 + name_len > _MAX_DIR:
            base = "/tmp"  # a long TMPDIR: a socket under it could not be bound
        return cls(OwnedDir.create(PREFIX, base))

    def socket_for(self, rank: int, incarnation: int) -> Path:
        """The socket server `rank` binds; each incarnation its own (a dead server's socket file stays behind)."""
        return self.path / f"s{int(rank)}-{int(incarnation)}.sock"

    def remove(self) -> None:
        """The directory and everything in it; idempotent."""
        self.owned.remove()


def url_of(socket: Path) -> str:
    """The base URL of the server on `socket`: its host is the socket's name, which the routes map back."""
    if not _SOCKET.fullmatch(socket.name):
        raise ValueError(f"not a server socket name: {socket.name!r}")
    return f"http://{socket.name}"


def sweep(base: str) -> list[str]:
    """Remove this user's socket directories of this pid namespace whose owner is no longer alive; their names."""
    return sweep_dirs(PREFIX, base)


class _Routes(Generic[T]):
    """One transport per server socket of `directory`, made on first use: a request's host names its socket."""

    def __init__(self, directory: Path, make: Callable[[str], T]):
        self.directory, self.make = directory, make
        self.transports: dict[str, T] = {}
        self._lock = threading.Lock()

    def to(self, request: httpx.Request) -> T:
        host = request.url.host
        if not _SOCKET.fullmatch(host):  # only our own names: never a path out of the directory
            raise httpx.ConnectError(f"no server socket is named {host!r}", request=request)
        with self._lock:
            t = self.transports.get(host)
            if t is None:
                t = self.transports[host] = self.make(str(self.directory / host))
            return t

    def take_all(self) -> list[T]:
        with self._lock:
            out, self.transports = list(self.transports.values()), {}
        return out


class SocketRoutes(httpx.BaseTransport):
    """httpx transport: each request to the Unix socket of `directory` its URL's host names (`url_of`)."""

    def __init__(self, directory: Path, limits: httpx.Limits | None = None):
        lim = limits or httpx.Limits()
        self._routes = _Routes(directory, lambda p: httpx.HTTPTransport(uds=p, limits=lim))

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        return self._routes.to(request).handle_request(request)

    def close(self) -> None:
        for t in self._routes.take_all():
            with contextlib.suppress(Exception):  # a transport that fails to close holds nothing we need
                t.close()


class AsyncSocketRoutes(httpx.AsyncBaseTransport):
    """`SocketRoutes` for an httpx.AsyncClient."""

    def __init__(self, directory: Path, limits: httpx.Limits | None = None):
        lim = limits or httpx.Limits()
        self._routes = _Routes(directory, lambda p: httpx.AsyncHTTPTransport(uds=p, limits=lim))

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self._routes.to(request).handle_async_request(request)

    async def aclose(self) -> None:
        for t in self._routes.take_all():
            with contextlib.suppress(Exception):
                await t.aclose()
