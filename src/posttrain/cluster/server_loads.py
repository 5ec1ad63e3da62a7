"""How a push's weights reach a VLLMServerPool's servers (cluster/vllm_servers.py): one class per transport.

    loads.write(state)        under the pool's write lock: the full state (HF names, a tied output layer under its
                              own name) kept where the servers read it, in their dtype; it stays there until the
                              next push, so a server
                              restarted between pushes loads the last pushed version without the trainer
    loads.load_one(server)    one server loads it (a restart, a stale server); inside the pool's pause/label step
    loads.push_all(slots)     `collective` transports only: every live server loads it at once

- `FileLoad` (transport=file): a safetensors file in the pool's weights folder, reloaded by vLLM's own
  `reload_weights(weights_path=...)`. Costs a write and a read of the whole model per push (1.66 s for the default
  model to two servers here); it needs nothing of posttrain inside the server.
- `SharedLoad` (transport=shared_memory, the default for servers on this host): the weights cast once into one
  shared-memory block (sampling/weight_transfer.py FlatWeights); each server's worker maps the block and loads it in
  place (posttrain's worker extension, sampling/vllm_receiver.py). No file, no serialisation; the servers load in
  parallel.
- `GroupLoad` (transport=group): the same flat copy, broadcast in buckets over a torch.distributed group the trainer
  (rank 0) and the servers' workers (ranks 1..K) join: the shape that reaches engines on other hosts. The group
  (sampling/weight_group.py) listens on 127.0.0.1 only, each server is invited with the group's secret in its
  /collective_rpc call, and every bucket is checked against its digest before it loads, so a process on this
  host that is not a member can neither be sent the weights nor make a server load forged ones. The group is
  kept between pushes and rebuilt when its members change (a server restarted or retired) or after a join or a
  broadcast failed. A server that dies mid-broadcast fails the broadcast within the group's timeout; the servers
  still healthy load again in a rebuilt group, the dead one is restarted and loads through a group of its own.
"""

from __future__ import annotations

import itertools
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from posttrain.cluster.server_processes import Server, ServerPoolError, _ServerFailed
from posttrain.sampling import weight_group as wg
from posttrain.sampling import weight_transfer as wt
from posttrain.sampling.vllm_weights import servable_state
from posttrain.sampling.weight_ipc import save_safetensors_atomic

# The pool (cluster/vllm_servers.py VLLMServerPool) and its slots, as this module uses them: `pool.rpc`,
# `pool.healthy`, `pool._sync_server`, `pool._recover`, `pool.log`, `pool.timeout_s`, `pool.max_restarts`,
# `pool.spec.dtype`, `pool.weights_dir`; a slot's `server` and `retired`. Typed loosely: the pool imports this module.
VLLMServerPool = Any
Slot = Any

DEFAULT_BUCKET_MB = wt.DEFAULT_BUCKET_MB
EXTENSION = "posttrain.sampling.vllm_receiver.WeightReceiver"
WEIGHTS_FILE = "model.safetensors"


class FileLoad:
    kind = "file"
    collective = False
    server_flags: list[str] = []

    def __init__(self, pool: VLLMServerPool, backend: str = "gloo", bucket_mb: float = DEFAULT_BUCKET_MB):
        self.pool = pool

    def write(self, state: dict[str, Any]) -> None:
        servable = servable_state(state, self.pool.spec.dtype, tied=False)  # cast, one tensor per storage
        save_safetensors_atomic(servable, self.pool.weights_dir / WEIGHTS_FILE, metadata={"format": "pt"})

    def load_one(self, server: Server) -> None:
        # Always the same folder: a reload from a path repoints the server's model path there.
        self.pool.rpc(server, "reload_weights", {"weights_path": str(self.pool.weights_dir)})

    def push_all(self, slots: list[Slot]) -> None:  # pragma: no cover - not collective
        raise NotImplementedError

    def close(self) -> None:
        pass


class _FlatLoad:
    """The flat copy both memory transports share: laid out at the first push (the layout never changes: the same
    model every push), refilled in place after."""

    server_flags = ["--worker-extension-cls", EXTENSION]
    shared = False

    def __init__(self, pool: VLLMServerPool, backend: str = "gloo", bucket_mb: float = DEFAULT_BUCKET_MB):
        self.pool, self.backend = pool, backend
        self.bucket_bytes = int(bucket_mb * 2**20)
        self.flat: wt.FlatWeights | None = None
        self.buckets: list[tuple[int, int]] = []

    def write(self, state: dict[str, Any]) -> None:
        if self.flat is None:
            self.flat = wt.FlatWeights(wt.engine_specs(state, self.pool.spec.dtype), shared=self.shared)
            self.buckets = wt.plan_buckets(self.flat.specs, self.bucket_bytes)
        self.flat.fill(state)  # the cast to the servers' dtype happens in this one copy

    def close(self) -> None:
        if self.flat is not None:
            self.flat.close()
            self.flat = None


class SharedLoad(_FlatLoad):
    kind = "shared memory"
    collective = False
    shared = True

    def load_one(self, server: Server) -> None:
        assert self.flat is not None
        self.pool.rpc(server, "posttrain_load_shared", {"args": wt.layout_json(self.flat.specs, shm=self.flat.name)})

    def push_all(self, slots: list[Slot]) -> None:  # pragma: no cover - not collective
        raise NotImplementedError


class _Group:
    def __init__(self, members: tuple[int, ...], group: wg.WeightGroup):
        self.members, self.group = members, group


class GroupLoad(_FlatLoad):
    kind = "group"
    collective = True
    _names = itertools.count()

    def __init__(self, pool: VLLMServerPool, backend: str = "gloo", bucket_mb: float = DEFAULT_BUCKET_MB):
        super().__init__(pool, backend, bucket_mb)
        self.group: _Group | None = None  # the push path's group, kept while its members stay
        self.rebuilds = 0

    def _open(self, servers: list[Server]) -> _Group:
        """A group of this process (rank 0) and `servers` (ranks 1..K in order): each server joins through its
        worker extension while this process opens its end; the first failure fails the whole join."""
        pool = self.pool
        timeout = pool.timeout_s
        down = [s.url for s in servers if not pool.healthy(s)]
        if down:  # fail now: a join posted to the others would hold their engines until the group's timeout
            raise RuntimeError(f"not answering, so not joining the weight group: {', '.join(down)}")
        store = wg.host_store("127.0.0.1", timeout)  # every server is on this host: loopback only
        name = f"posttrain-weights-{next(self._names)}"
        inv = wg.Invitation("127.0.0.1", store.port, name, wg.new_token(), 0, len(servers) + 1, self.backend, timeout)

        def join(i_server: tuple[int, Server]) -> None:
            i, server = i_server
            pool.rpc(server, "posttrain_join", {"args": inv.for_rank(i + 1).to_json()})

        with ThreadPoolExecutor(max_workers=len(servers), thread_name_prefix="weight-join") as ex:
            futures = [ex.submit(join, (i, s)) for i, s in enumerate(servers)]
            # raises when a member never comes or is not a member
            group = wg.open_group(inv, store, device="cuda" if self.backend == "nccl" else "cpu")
            for f in futures:
                f.result()
        self.rebuilds += 1
        return _Group(tuple(id(s) for s in servers), group)

    def _broadcast(self, group: _Group, servers: list[Server], sync: bool) -> dict[int, BaseException]:
        """Every server of `group` loads the flat copy: each receives inside its pause/label step (`sync`: the
        pool's `_sync_server`; False: the bare receive, inside a step the caller runs) while this thread sends.
        Returns the failures by server index."""
        pool, flat = self.pool, self.flat
        assert flat is not None
        nonce = wg.new_nonce()
        digests = wg.bucket_digests(group.group, nonce, flat.data, self.buckets)
        layout = wt.layout_json(flat.specs, self.buckets, name=group.group.name, nonce=nonce, digests=digests)

        def receive(server: Server) -> None:
            pool.rpc(server, "posttrain_receive", {"args": layout})

        errors: dict[int, BaseException] = {}
        with ThreadPoolExecutor(max_workers=len(servers), thread_name_prefix="weight-recv") as ex:
            futures = [ex.submit(pool._sync_server, s, receive) if sync else ex.submit(receive, s) for s in servers]
            try:
                wg.send_flat(group.group, flat.data, self.buckets)
            except Exception as e:  # noqa: BLE001 - any transport failure: the group is broken for everyone
                send_error: BaseException | None = e
            else:
                send_error = None
            for i, f in enumerate(futures):
                try:
                    f.result()
                except Exception as e:  # noqa: BLE001 - recorded per server, handled by the caller
                    errors[i] = e
        if send_error is not None and not errors:
            errors = dict.fromkeys(range(len(servers)), send_error)
        return errors

    def load_one(self, server: Server) -> None:
        """A group of this process and `server` alone, opened for this load and dropped after (the push path's
        group is rebuilt at the next push, since its members changed)."""
        try:
            group = self._open([server])
        except Exception as e:  # noqa: BLE001 - any failure to join is this server's: the caller restarts it
            raise _ServerFailed(f"{server.url}: could not join a weight group: {e}") from None
        errors = self._broadcast(group, [server], sync=False)
        if errors:
            raise _ServerFailed(f"{server.url}: weight broadcast failed: {errors[0]}")

    def push_all(self, slots: list[Slot]) -> None:
        """Every live slot's server loads the push by one broadcast. On a failure, the servers still healthy load
        again in a rebuilt group; a dead or hung one is restarted (and loads through a group of its own) or retired,
        as the pool's restarts allow."""
        pool = self.pool
        pending = list(slots)
        for _ in range(pool.max_restarts + 2):
            servers = [s.server for s in pending]
            members = tuple(id(s) for s in servers)
            t0 = time.perf_counter()
            try:
                if self.group is None or self.group.members != members:
                    self.group = self._open(servers)
                errors = self._broadcast(self.group, servers, sync=True)
            except Exception as e:  # noqa: BLE001 - the join failed: who is at fault is found below
                errors = dict.fromkeys(range(len(servers)), e)
            if not errors:
                return
            self.group = None
            why = next(iter(errors.values()))
            pool.log(
                f"vllm servers: weight broadcast to {len(errors)} of {len(servers)} failed after "
                f"{time.perf_counter() - t0:.1f}s ({type(why).__name__}: {str(why)[:200]})"
            )
            retry = []
            for i in errors:
                slot, server = pending[i], servers[i]
                if pool.healthy(server):
                    retry.append(slot)  # the broken group failed it, not its own fault: load again
                else:
                    pool._recover(slot, server, "failed")  # restarted (loading alone) or retired
            pending = [s for s in retry if not s.retired]
            if not pending:
                return
        raise ServerPoolError(f"the weight broadcast kept failing for {len(pending)} healthy servers")

    def close(self) -> None:
        self.group = None
        super().close()


LOADS: dict[str, type] = {"file": FileLoad, "shared_memory": SharedLoad, "group": GroupLoad}


class ServerPoolWeights:
    """WeightSync (loop/weight_sync.py) for a VLLMServerPool: every push sends the trainer's full weights under HF
    checkpoint names; a peft model is merged (W + scale * B @ A, out of place: `hf_state`), since the servers are
    pushed whole weights, and `reload_weights` wants every parameter."""

    def __init__(self, model: Any, pool: VLLMServerPool):
        self.model, self.pool = model, pool

    def push(self, version: int) -> dict[str, float]:
        from posttrain.sampling.vllm_weights import hf_state

        t0 = time.perf_counter()
        m = self.pool.push(hf_state(self.model), version)
        return {**m, "time/weight_sync": time.perf_counter() - t0, **self.pool.metrics()}

    def close(self) -> None:
        """The servers live as long as the transport that feeds them."""
        self.pool.close()
