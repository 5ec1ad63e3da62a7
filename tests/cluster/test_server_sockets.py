"""Where a vLLM server pool's servers listen (cluster/server_sockets.py): a directory only this user can enter,
removed by its owner and swept when its owner is gone, and the transports that reach a server by its socket's name
and nothing else."""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from posttrain.cluster.server_sockets import AsyncSocketRoutes, SocketDir, SocketRoutes, sweep, url_of
from posttrain.owned import ns_tag as _ns_tag


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_socket_dir_is_private_short_enough_and_removed_once():
    sockets = SocketDir.create()
    try:
        st = os.lstat(sockets.path)
        assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.geteuid()
        assert sockets.path.name.startswith(f"posttrain-vllm-{os.getpid()}-{_ns_tag()}-")
        # vLLM binds <dir>/<uuid4> for its own sockets: that must fit a socket address (107 bytes)
        assert len(str(sockets.path)) + 1 + 36 <= 107
        s = sockets.socket_for(2, 7)
        assert s.parent == sockets.path and url_of(s) == "http://s2-7.sock"
    finally:
        sockets.remove()
    assert not sockets.path.exists()
    sockets.remove()  # idempotent


def test_a_long_temporary_directory_falls_back_to_tmp():
    sockets = SocketDir.create(base="/tmp/" + "x" * 90)  # never made: a socket under it could not be bound
    try:
        assert sockets.path.parent == Path("/tmp")
    finally:
        sockets.remove()


def test_url_of_takes_server_socket_names_only():
    for bad in ["x.sock", "s1-2.sock/../a", "s1.sock", "s-1-2.sock"]:
        with pytest.raises(ValueError):
            url_of(Path("/d") / bad)


def test_the_sweep_removes_this_users_dirs_whose_owner_is_dead_and_nothing_else(tmp_path):
    tag = _ns_tag()
    other_tag = "000000" if tag != "000000" else "ffffff"
    dead = _dead_pid()
    names = {
        "dead": f"posttrain-vllm-{dead}-{tag}-abcd_123",
        "alive": f"posttrain-vllm-{os.getpid()}-{tag}-abcd_123",
        "other_namespace": f"posttrain-vllm-{dead}-{other_tag}-abcd_123",
        "unrelated": f"posttrain-other-{dead}-{tag}-abcd_123",
    }
    for name in names.values():
        (tmp_path / name).mkdir()
        (tmp_path / name / "s0-0.sock").write_text("")
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "keep").write_text("")
    link = tmp_path / f"posttrain-vllm-{dead}-{tag}-link_123"
    link.symlink_to(target)  # a link named like a dead owner's directory: never followed
    assert sweep(str(tmp_path)) == [names["dead"]]
    assert not (tmp_path / names["dead"]).exists()
    assert all((tmp_path / names[k]).exists() for k in ("alive", "other_namespace", "unrelated"))
    assert link.is_symlink() and (target / "keep").exists()


def test_a_forked_child_leaves_its_parents_dir():
    sockets = SocketDir.create()
    try:
        pid = os.fork()
        if pid == 0:
            sockets.remove()  # the child's exit runs the finalizer too: neither may remove the parent's directory
            os._exit(0)
        os.waitpid(pid, 0)
        assert sockets.path.is_dir()
    finally:
        sockets.remove()


class _Named:
    """An ASGI app that answers every request with its name and the host header it got."""

    def __init__(self, name: str):
        self.name = name

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return
        host = dict(scope["headers"]).get(b"host", b"").decode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": f"{self.name} {host}".encode()})


def _serve(app, path: Path):
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, uds=str(path), log_level="warning", lifespan="off"))
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started
    return server, t


def test_the_routes_reach_each_server_by_its_socket_name_and_no_other_host():
    pytest.importorskip("uvicorn")
    sockets = SocketDir.create()
    servers = []
    try:
        for rank in range(2):
            servers.append(_serve(_Named(f"server{rank}"), sockets.socket_for(rank, 0)))
        with httpx.Client(transport=SocketRoutes(sockets.path), timeout=10) as http:
            for rank in range(2):
                url = url_of(sockets.socket_for(rank, 0))
                assert http.get(url + "/health").text == f"server{rank} s{rank}-0.sock"
            for bad in ["http://127.0.0.1:8000/health", "http://localhost/health", "http://s9-9.sock/health"]:
                with pytest.raises(httpx.ConnectError):  # not one of ours, or no such server: nothing is reached
                    http.get(bad)

        async def both() -> list[str]:
            async with httpx.AsyncClient(transport=AsyncSocketRoutes(sockets.path), timeout=10) as client:
                rs = await asyncio.gather(*(client.get(url_of(sockets.socket_for(r, 0)) + "/x") for r in range(2)))
                with pytest.raises(httpx.ConnectError):
                    await client.get("http://127.0.0.1:8000/x")
                return [r.text.split()[0] for r in rs]

        assert asyncio.run(both()) == ["server0", "server1"]
    finally:
        for server, t in servers:
            server.should_exit = True
            t.join(10)
        sockets.remove()
