"""The group transport of a vLLM server pool (cluster/server_loads.py GroupLoad) against a process that is not a
member: it reaches the trainer's rendezvous store while a push forms and plays rank 1 (to be sent the weights),
rank 0 (to send the server forged ones), or both, or holds a member's place. The push must refuse it or reject the
forgery, within about the group's timeout, and the server must only ever load the weights the trainer pushed.

The server is played in this process: a WeightReceiver (sampling/vllm_receiver.py) whose model runner records what
it loads, behind a pool that calls its methods where a real pool posts to /collective_rpc. The intruder learns the
store's port as `ss -ltnp` would show it (here: from the TCPStore the trainer makes) and the group's keys by
listing the store's keys, as any local process can."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from store_intruder import REAL_STORE, bg, other_address, store_client, wait_for, wait_key

from posttrain.cluster.server_loads import GroupLoad
from posttrain.sampling import weight_transfer as wt
from posttrain.sampling.vllm_receiver import WeightReceiver

T = 5.0  # the group's timeout in these tests
BUCKET_MB = 0.004  # ~4 KB: the state below is cut into several buckets
REAL_GLOO = dist.ProcessGroupGloo


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return {"a.weight": torch.randn(300, generator=g), "b.weight": torch.randn(40, 50, generator=g)}


class _Runner:
    """vLLM's model runner as the receiver uses it: records every tensor each reload consumed."""

    def __init__(self) -> None:
        self.loads: list[dict[str, torch.Tensor]] = []

    def reload_weights(self, weights_iterator) -> None:
        got: dict[str, torch.Tensor] = {}
        self.loads.append(got)
        for name, t in weights_iterator:
            got[name] = t.clone()


class _Receiver(WeightReceiver):
    def __init__(self) -> None:
        self.model_runner = _Runner()


class _Pool:
    """What GroupLoad uses of a VLLMServerPool; `rpc` calls the in-process receiver. A join may be held until the
    intruder is in place (its head start); every join's duration and outcome is recorded."""

    def __init__(self, hold_join: threading.Event | None = None) -> None:
        self.spec = SimpleNamespace(dtype=None)
        self.timeout_s, self.max_restarts = T, 0
        self.logs: list[str] = []
        self.joins: list[tuple[float, str]] = []
        self.hold_join = hold_join

    def rpc(self, server, method: str, kwargs: dict[str, str]):
        fn = getattr(server.receiver, method)
        if method != "posttrain_join":
            return json.loads(fn(kwargs["args"]))
        if self.hold_join is not None:
            self.hold_join.wait(3 * T)
        t0 = time.monotonic()
        try:
            out = json.loads(fn(kwargs["args"]))
        except Exception as e:
            self.joins.append((time.monotonic() - t0, f"{type(e).__name__}: {e}"))
            raise
        self.joins.append((time.monotonic() - t0, "joined"))
        return out

    def healthy(self, server) -> bool:
        return True

    def sync_server(self, server, load) -> None:
        load(server)

    def log(self, msg: str) -> None:
        self.logs.append(msg)

    def member(self, slot):
        return slot.server

    def recover(self, slot, server, why: str) -> None:
        slot.retired = True


@pytest.fixture
def store_ports(monkeypatch):
    """The ports of the rendezvous stores this process hosts, as `ss -ltnp` would list them."""
    ports: list[int] = []

    class Spy(REAL_STORE):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            if kwargs.get("is_master", len(args) > 3 and args[3]):
                ports.append(self.port)

    monkeypatch.setattr(dist, "TCPStore", Spy)
    return ports


def _root0():
    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    return opts


class _Intruder:
    """A local process that is not a member: it connects to the store of the first push it sees, finds the group's
    keys (`list_keys`) and joins as rank 1 (it is sent the weights: `stolen`), as rank 0 (it sends forged weights
    to the server) or both; the layout it needs is no secret (the model's architecture is public)."""

    FORGED = 0x42

    def __init__(self, ports: list[int], role: str, buckets: list[tuple[int, int]]) -> None:
        self.ports, self.role, self.buckets = ports, role, buckets
        self.ready = threading.Event()  # the server's join may proceed: the intruder is in place
        self.stolen: bytes | None = None
        self.errors: list[str] = []
        self.thread = bg(self._run)

    def _join(self, store, prefix: str, rank: int):
        return REAL_GLOO(dist.PrefixStore(prefix, store), rank, 2, timedelta(seconds=T))

    def _run(self) -> None:
        try:
            port = wait_for("a store", lambda: self.ports and self.ports[0], 3 * T)
            store = store_client(port, T)
            key = wait_key(store, "/0/0", 3 * T)
            prefix = key[: -len("/0/0")]
            if self.role in ("rank1", "both"):
                bg(self._steal, store_client(port, T), prefix)  # a client of its own: a wait blocks it
                if self.role == "both":  # as rank 0 only once the trainer has its rank 1 (this intruder)
                    time.sleep(0.5)
                    store.delete_key(f"{prefix}/0/1")
            if self.role in ("rank0", "both"):
                first = store.get(key)
                bg(self._forge, store_client(port, T), prefix)
                wait_for("the rank-0 key replaced", lambda: store.get(key) != first, 3 * T)
        except Exception as e:  # noqa: BLE001 - the intruder's failure is an outcome the test looks at
            self.errors.append(f"{type(e).__name__}: {e}")
        finally:
            self.ready.set()

    def _steal(self, store, prefix: str) -> None:
        try:
            pg = self._join(store, prefix, 1)
            got = []
            for a, b in self.buckets:
                buf = torch.empty(b - a, dtype=torch.uint8)
                pg.broadcast([buf], _root0()).wait()
                got.append(buf.numpy().tobytes())
            self.stolen = b"".join(got)
        except Exception as e:  # noqa: BLE001 - as above
            self.errors.append(f"steal: {type(e).__name__}: {str(e)[:200]}")

    def _forge(self, store, prefix: str) -> None:
        try:
            pg = self._join(store, prefix, 0)
            for a, b in self.buckets:
                pg.broadcast([torch.full((b - a,), self.FORGED, dtype=torch.uint8)], _root0()).wait()
        except Exception as e:  # noqa: BLE001 - as above
            self.errors.append(f"forge: {type(e).__name__}: {str(e)[:200]}")


def _push(pool: _Pool, state) -> tuple[_Receiver, GroupLoad, BaseException | None, float]:
    """One push of `state` to one in-process server; returns the receiver, the loads, the push's error, its time."""
    receiver = _Receiver()
    slot = SimpleNamespace(server=SimpleNamespace(url="http://server-0", receiver=receiver), retired=False)
    loads = GroupLoad(pool, "gloo", BUCKET_MB)
    loads.write(state)
    t0 = time.monotonic()
    try:
        loads.push_all([slot])
        error = None
    except Exception as e:  # noqa: BLE001 - a refused push is one of the outcomes the tests accept
        error = e
    return receiver, loads, error, time.monotonic() - t0


def _layout(state) -> tuple[bytes, list[tuple[int, int]]]:
    flat = wt.FlatWeights(wt.engine_specs(state, None))
    flat.fill(state)
    real = flat.data.numpy().tobytes()
    buckets = wt.plan_buckets(flat.specs, int(BUCKET_MB * 2**20))
    flat.close()
    return real, buckets


@pytest.mark.parametrize("role", ["rank1", "both"])
def test_an_intruder_is_never_sent_the_weights_and_never_makes_the_server_load_forged_ones(store_ports, role):
    state = _state()
    real, buckets = _layout(state)
    assert len(buckets) > 1
    hold = threading.Event()
    intruder = _Intruder(store_ports, role, buckets)
    bg(lambda: (intruder.ready.wait(3 * T), hold.set()))
    pool = _Pool(hold_join=hold)
    receiver, loads, error, seconds = _push(pool, state)
    intruder.thread.join(4 * T)
    try:
        stolen = intruder.stolen is not None and intruder.stolen == real[: len(intruder.stolen)]
        assert not stolen, ("the intruder was sent the weights", pool.logs)
        for got in receiver.model_runner.loads:  # whatever was loaded is the trainer's, never a forged byte
            for name, t in got.items():
                assert torch.equal(t, state[name]), (name, pool.logs, intruder.errors)
        for took, outcome in pool.joins:  # a refused join fails within about the group's timeout
            assert took < T + 12, (took, outcome)
        if error is None:  # the push went through (in a rebuilt group): the server holds exactly the push
            assert receiver.model_runner.loads and receiver.model_runner.loads[-1].keys() == state.keys()
        assert seconds < 60, (seconds, pool.logs)  # each refused round fails within about the group's timeout
    finally:
        loads.close()


def _hold(store, prefix: str) -> None:
    """An impostor in rank 1's place: it joins and holds (it cannot read a sealed address: its join fails)."""
    try:
        REAL_GLOO(dist.PrefixStore(prefix, store), 1, 2, timedelta(seconds=60))
    except Exception:  # noqa: BLE001 - the impostor's own failure is no outcome the test looks at
        pass


def test_an_impostor_holding_the_servers_place_fails_its_join_within_the_group_timeout(store_ports, monkeypatch):
    """The server joins as rank 1; an impostor then claims rank 1 too before the trainer reads who rank 1 is (the
    trainer made slow here). Before: the server's join waited ~40 s for a trainer paired with the impostor."""
    in_place = threading.Event()

    class SlowTrainer(REAL_GLOO):
        def __init__(self, store, rank, *args):
            if rank == 0:
                in_place.wait(3 * T)
            super().__init__(store, rank, *args)

    monkeypatch.setattr(dist, "ProcessGroupGloo", SlowTrainer)

    def impostor() -> None:
        try:
            port = wait_for("a store", lambda: store_ports and store_ports[0], 3 * T)
            store = store_client(port, T)
            key = wait_key(store, "/0/1", 3 * T)
            first = store.get(key)
            own = store_client(port, T)
            bg(_hold, own, key[: -len("/0/1")])
            wait_for("rank 1's key replaced", lambda: store.get(key) != first, 3 * T)
        finally:
            in_place.set()

    thread = bg(impostor)
    pool = _Pool()
    _, loads, _, seconds = _push(pool, _state())
    thread.join(T)
    try:
        assert pool.joins, pool.logs
        for took, outcome in pool.joins:
            assert took < T + 12, (took, outcome)  # about the group's timeout; it was ~40 s
        assert seconds < 60, (seconds, pool.logs)
    finally:
        loads.close()


def _listening(inodes: set[str]) -> list[str]:
    """The local address of every TCP socket of this process that listens, as hex ip:port from /proc/net/tcp*."""
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                parts = line.split()
                if parts[3] == "0A" and parts[9] in inodes:  # 0A: LISTEN
                    out.append(parts[1])
    return out


def _my_socket_inodes() -> set[str]:
    got = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            got.add(target[len("socket:[") : -1])
    return got


LOOPBACK = ("0100007F:", "0000000000000000FFFF00000100007F:", "00000000000000000000000001000000:")  # v4, v4 in v6, ::1


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="reads the listening sockets from /proc")
def test_every_socket_the_push_opens_listens_on_loopback_only(store_ports):
    before = set(_listening(_my_socket_inodes()))
    pool = _Pool()
    receiver, loads, error, _ = _push(pool, _state())
    try:
        assert error is None and receiver.model_runner.loads, pool.logs
        opened = [a for a in _listening(_my_socket_inodes()) if a not in before]  # the kept group's: store, gloo
        assert opened, "the kept group holds its sockets open"
        assert all(a.startswith(LOOPBACK) for a in opened), opened
        other = other_address()
        if other is not None:  # reached from this machine's own non-loopback address: refused
            with socket.socket() as s:
                s.settimeout(2)
                assert s.connect_ex((other, store_ports[-1])) != 0
    finally:
        loads.close()
