"""Starting a vLLM server of a pool (cluster/vllm_server_launch.py): the server listens on a Unix socket in the
pool's private directory and on no TCP port, vLLM's own sockets and temporary files go into that directory, and the
pool samples and pushes over the socket. A stand-in takes vLLM's place (tests/cluster/standin_vllm_server.py: the
same command line and routes) so this runs in seconds; tests/cluster/test_vllm_server_intruder.py does the same
against a real vLLM server."""

from __future__ import annotations

import asyncio
import os
import stat
import sys
from pathlib import Path

import pytest
import torch
from server_intruder import other_user_connects, reaches_over_tcp, tcp_listeners, unix_listeners

from posttrain.types import SampleParams

STANDIN = Path(__file__).with_name("standin_vllm_server.py")


def test_a_servers_environment_keeps_vllm_inside_the_private_directory(tmp_path, monkeypatch):
    from posttrain.cluster.vllm_server_launch import SERVER_ENV, server_env

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the in-process engine's: never a server's
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth0")
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    env = server_env(tmp_path, {})
    assert env["TMPDIR"] == env["VLLM_RPC_BASE_PATH"] == str(tmp_path)
    assert env["GLOO_SOCKET_IFNAME"] == "lo" and "VLLM_ENABLE_V1_MULTIPROCESSING" not in env
    assert all(env[k] == v for k, v in SERVER_ENV.items())
    assert server_env(tmp_path, {"TMPDIR": "/elsewhere"})["TMPDIR"] == "/elsewhere"  # the caller's env is last
    # torch's compile cache is not made private (it would be built again at every start)
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    assert env["TORCHINDUCTOR_CACHE_DIR"] == default_cache_dir()
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    assert server_env(tmp_path, {})["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "mine")


@pytest.fixture
def standin_pool(tmp_path, monkeypatch):
    pytest.importorskip("uvicorn")
    from posttrain.cluster import vllm_server_launch, vllm_servers
    from posttrain.sampling.vllm_engine import EngineSpec

    monkeypatch.setattr(vllm_server_launch, "SERVER_COMMAND", [sys.executable, str(STANDIN)])
    monkeypatch.setattr(vllm_servers, "vllm_installed", lambda: True)
    spec = EngineSpec(model_dir=str(tmp_path / "model"), dtype="float32", max_model_len=256)
    logs: list[str] = []
    pool = vllm_servers.VLLMServerPool.start(spec, None, [0], num_servers=1, work_dir=tmp_path / "work",
                                             timeout_s=30, start_timeout_s=120, max_restarts=1, log=logs.append,
                                             transport="file")
    yield pool
    pool.close()


def _server_pid(pool) -> int:
    """The server under the slot's watchdog (the watchdog's one child)."""
    watchdog = pool.slots[0].server.proc.pid
    children = Path(f"/proc/{watchdog}/task/{watchdog}/children").read_text().split()
    assert len(children) == 1, children
    return int(children[0])


def test_a_pool_reaches_its_server_over_a_private_unix_socket_only(standin_pool):
    pool = standin_pool
    server = pool.slots[0].server
    private = pool.sockets.path
    st = os.lstat(private)
    assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.geteuid()
    assert server.socket.parent == private and stat.S_ISSOCK(os.lstat(server.socket).st_mode)
    # the command line binds the socket and no TCP port; the environment keeps vLLM's own sockets in the directory
    pid = _server_pid(pool)
    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert b"--uds" in cmd and cmd[cmd.index(b"--uds") + 1] == str(server.socket).encode()
    assert b"--host" not in cmd and b"--port" not in cmd
    env = dict(e.split(b"=", 1) for e in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if b"=" in e)
    assert env[b"TMPDIR"] == env[b"VLLM_RPC_BASE_PATH"] == str(private).encode()
    # the intruder: nothing over TCP; the socket refuses another user (the stand-in's socket file itself is 0666)
    listeners = tcp_listeners(server.pgid)
    assert listeners == [], listeners
    assert unix_listeners(server.pgid) == [str(server.socket)]
    assert other_user_connects(str(server.socket)) in ((None,) if os.geteuid() else (False,))
    # and the pool works over it: a push reaches the server (file transport: its reload), then samples are stamped
    pool.push({"w": torch.ones(3)}, 7)
    calls = pool._http.get(server.url + "/standin/calls").json()
    assert [c["method"] for c in calls] == ["reload_weights"]
    assert calls[0]["kwargs"]["weights_path"] == str(pool.weights_dir)
    groups = asyncio.run(pool.sample([[1, 2, 3], [4, 5]], SampleParams(max_tokens=3), n=2))
    assert [len(g) for g in groups] == [2, 2] and {v for g in groups for c in g for v in c.token_versions} == {7}
    assert reaches_over_tcp(listeners, "/collective_rpc", {"method": "reload_weights"}) == []


def test_closing_the_pool_removes_its_socket_directory(standin_pool):
    pool = standin_pool
    private, pgid = pool.sockets.path, pool.slots[0].server.pgid
    assert private.is_dir()
    pool.close()
    assert not private.exists()
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)


def test_a_restarted_server_binds_a_socket_of_its_own(standin_pool):
    pool = standin_pool
    slot = pool.slots[0]
    first = slot.server
    os.killpg(first.pgid, 9)
    first.proc.wait(30)
    groups = asyncio.run(pool.sample([[1, 2]], SampleParams(max_tokens=2)))
    assert len(groups) == 1 and slot.server is not first and slot.incarnation == 1
    assert slot.server.socket == pool.sockets.socket_for(0, 1) and slot.server.socket.parent == first.socket.parent


def test_the_other_user_probe_can_succeed():
    """The probe above is not vacuous: as root, it connects to a socket another user may reach."""
    import shutil
    import socket
    import tempfile

    if os.geteuid() != 0:
        pytest.skip("only root can become another user")
    d = Path(tempfile.mkdtemp(prefix="posttrain-probe-"))
    try:
        d.chmod(0o755)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.bind(str(d / "open.sock"))
            (d / "open.sock").chmod(0o666)
            s.listen(1)
            assert other_user_connects(str(d / "open.sock")) is True
            (d / "open.sock").chmod(0o600)
            assert other_user_connects(str(d / "open.sock")) is False
    finally:
        shutil.rmtree(d)
