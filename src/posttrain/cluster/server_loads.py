"""How a push's weights reach a ServerPool's servers (cluster/vllm_servers.py): one class per transport.

    loads.write(state)        under the pool's write lock: the full state (HF names, a tied output layer under its
                              own name) kept where the servers read it, in their dtype; it stays there until the
                              next push, so a server
                              restarted between pushes loads the last pushed version without the trainer
    loads.load_one(server)    one server loads it (a restart, a stale server); inside the pool's pause/label step
    loads.push_all(slots)     every live slot's server loads it: one by one through the pool's pause/label step
                              (`pool.push_each`: file, shared memory), or by one broadcast (group)

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
  The group and that retry are cluster/group_broadcast.py's, shared with the Ray actors' transport.

The pool is reached through `ServerPool` (its public methods), which cluster/vllm_servers.py ServerPool is.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

from posttrain.cluster.group_broadcast import Broadcaster, Failure, Outcomes, load_all
from posttrain.cluster.server_processes import Server, ServerFailed, ServerPoolError, Slot
from posttrain.sampling import weight_transfer as wt
from posttrain.sampling.vllm_common import EngineSpec
from posttrain.sampling.vllm_weights import servable_state
from posttrain.sampling.weight_ipc import save_safetensors_atomic


class ServerPool(Protocol):
    """What a transport uses of its pool (cluster/vllm_servers.py ServerPool): the recovery protocol of
    cluster/group_broadcast.py (`member`, `recover`), the servers' calls, and the settings the loads read."""

    spec: EngineSpec
    weights_dir: Path
    timeout_s: float
    max_restarts: int

    def log(self, msg: str) -> Any: ...

    def rpc(self, server: Server, method: str, kwargs: dict[str, str]) -> Any: ...

    def healthy(self, server: Server) -> bool: ...

    def sync_server(self, server: Server, load: Callable[[Server], None] | None) -> None: ...

    def push_each(self, slots: list[Slot], reload: bool = True) -> None: ...

    def member(self, slot: Slot) -> Server: ...

    def recover(self, slot: Slot, failed: Server, why: str) -> Slot: ...

    def push(self, state: dict[str, Any], version: int) -> dict[str, float]: ...

    def metrics(self) -> dict[str, float]: ...

    def close(self) -> None: ...


DEFAULT_BUCKET_MB = wt.DEFAULT_BUCKET_MB
EXTENSION = "posttrain.sampling.vllm_receiver.WeightReceiver"
WEIGHTS_FILE = "model.safetensors"


class FileLoad:
    kind = "file"
    server_flags: list[str] = []

    def __init__(self, pool: ServerPool, backend: str = "gloo", bucket_mb: float = DEFAULT_BUCKET_MB):
        self.pool = pool

    def write(self, state: dict[str, Any]) -> None:
        servable = servable_state(state, self.pool.spec.dtype, tied=False)  # cast, one tensor per storage
        save_safetensors_atomic(servable, self.pool.weights_dir / WEIGHTS_FILE, metadata={"format": "pt"})

    def load_one(self, server: Server) -> None:
        # Always the same folder: a reload from a path repoints the server's model path there.
        self.pool.rpc(server, "reload_weights", {"weights_path": str(self.pool.weights_dir)})

    def push_all(self, slots: list[Slot]) -> None:
        self.pool.push_each(slots)

    def close(self) -> None:
        pass


class _FlatLoad:
    """The flat copy both memory transports share: laid out at the first push (the layout never changes: the same
    model every push), refilled in place after."""

    server_flags = ["--worker-extension-cls", EXTENSION]
    shared = False

    def __init__(self, pool: ServerPool, backend: str = "gloo", bucket_mb: float = DEFAULT_BUCKET_MB):
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
    shared = True

    def load_one(self, server: Server) -> None:
        assert self.flat is not None
        self.pool.rpc(server, "posttrain_load_shared", {"args": wt.layout_json(self.flat.specs, shm=self.flat.name)})

    def push_all(self, slots: list[Slot]) -> None:
        """The servers map the block at once: each through its own pause/load/label step, in parallel."""
        self.pool.push_each(slots)


class _ServerCalls:
    """How GroupLoad's members are asked (group_broadcast.MemberCalls): through the pool's /collective_rpc, each
    call in a thread of its own. `sync`: a receive runs inside the server's pause/label step (the pool's
    `sync_server`); False: the bare receive, inside a step the caller runs (a restart's load)."""

    def __init__(self, pool: ServerPool, sync: bool):
        self.pool, self.sync = pool, sync

    def key(self, slot: Slot) -> object:
        return slot.server

    def _post(self, slots: Sequence[Slot], call: Callable[[int, Server], None]) -> Outcomes:
        servers = [s.server for s in slots]
        ex = ThreadPoolExecutor(max_workers=len(servers), thread_name_prefix="weight-rpc")
        futures = [ex.submit(call, i, s) for i, s in enumerate(servers)]
        ex.shutdown(wait=False)  # its threads end with their calls, each bounded by the pool's timeout

        def outcomes() -> dict[int, Failure]:
            return {i: f for i, fut in enumerate(futures) if (f := self._outcome(fut, servers[i])) is not None}

        return outcomes

    def _outcome(self, fut: Future, server: Server) -> Failure | None:
        try:
            fut.result()
            return None
        except Exception as e:  # noqa: BLE001 - recorded per server: a healthy one loads again, a dead one restarts
            return Failure("failed" if self.pool.healthy(server) else "dead", e)

    def join(self, slots: Sequence[Slot], invitations: list[str]) -> Outcomes:
        return self._post(slots, lambda i, s: self.pool.rpc(s, "posttrain_join", {"args": invitations[i]}))

    def receive(self, slots: Sequence[Slot], layout: str) -> Outcomes:
        def receive(server: Server) -> None:
            self.pool.rpc(server, "posttrain_receive", {"args": layout})

        if self.sync:
            return self._post(slots, lambda _, s: self.pool.sync_server(s, receive))
        return self._post(slots, lambda _, s: receive(s))


class GroupLoad(_FlatLoad):
    kind = "group"

    def __init__(self, pool: ServerPool, backend: str = "gloo", bucket_mb: float = DEFAULT_BUCKET_MB):
        super().__init__(pool, backend, bucket_mb)
        # Every server is on this host: the groups' stores listen on loopback only. `pushes`: the push path's (each
        # receive inside its server's pause/label step); `lone`: one server's load, inside its caller's step.
        self.pushes, self.lone = (
            Broadcaster(_ServerCalls(pool, sync), "127.0.0.1", backend, pool.timeout_s, "posttrain-weights")
            for sync in (True, False)
        )

    @property
    def rebuilds(self) -> int:
        return self.pushes.rebuilds + self.lone.rebuilds

    def _round(self, slots: list[Slot]) -> dict[int, Failure]:
        assert self.flat is not None
        t0 = time.perf_counter()
        down = [s.server.url for s in slots if not self.pool.healthy(s.server)]
        if down:  # fail now: a join posted to the others would hold their engines until the group's timeout
            e = RuntimeError(f"not answering, so not joining the weight group: {', '.join(down)}")
            failures = {i: Failure("dead" if s.server.url in down else "failed", e) for i, s in enumerate(slots)}
        else:
            failures = self.pushes.round(slots, self.flat, self.buckets)
        if failures:
            why = next(iter(failures.values())).error
            self.pool.log(
                f"vllm servers: weight broadcast to {len(failures)} of {len(slots)} failed after "
                f"{time.perf_counter() - t0:.1f}s ({type(why).__name__}: {str(why)[:200]})"
            )
        return failures

    def load_one(self, server: Server) -> None:
        """A group of this process and `server` alone, opened for this load and dropped after (the push path's
        group is rebuilt at the next push, since its members changed)."""
        assert self.flat is not None
        if not self.pool.healthy(server):
            raise ServerFailed(f"{server.url}: could not join a weight group: not answering")
        failures = self.lone.alone(Slot(-1, server), self.flat, self.buckets)
        self.pushes.release()  # the server left the push path's group for this one
        if failures:
            raise ServerFailed(f"{server.url}: weight broadcast failed: {failures[0].error}")

    def push_all(self, slots: list[Slot]) -> None:
        """Every live slot's server loads the push by one broadcast. On a failure, the servers still healthy load
        again in a rebuilt group; a dead or hung one is restarted (and loads through a group of its own) or retired,
        as the pool's restarts allow (cluster/group_broadcast.py load_all)."""

        def fail(pending: list[Slot], last: Failure) -> ServerPoolError:
            return ServerPoolError(f"the weight broadcast kept failing for {len(pending)} healthy servers")

        load_all(self.pool, list(slots), self._round, self.pool.max_restarts + 2, fail)

    def close(self) -> None:
        self.pushes.release()
        self.lone.release()
        super().close()


Loads = FileLoad | SharedLoad | GroupLoad
# By `transport`: made with (pool, group backend, bucket MB); typed, so the pool a caller passes is checked against
# ServerPool.
LOADS: dict[str, type[FileLoad] | type[SharedLoad] | type[GroupLoad]] = {
    "file": FileLoad,
    "shared_memory": SharedLoad,
    "group": GroupLoad,
}


class ServerPoolWeights:
    """WeightSync (loop/weight_sync.py) for a ServerPool: every push sends the trainer's full weights under HF
    checkpoint names; a peft model is merged (W + scale * B @ A, out of place: `hf_state`), since the servers are
    pushed whole weights, and `reload_weights` wants every parameter."""

    def __init__(self, model: Any, pool: ServerPool):
        self.model, self.pool = model, pool

    def push(self, version: int) -> dict[str, float]:
        from posttrain.sampling.vllm_weights import hf_state

        t0 = time.perf_counter()
        m = self.pool.push(hf_state(self.model), version)
        return {**m, "time/weight_sync": time.perf_counter() - t0, **self.pool.metrics()}

    def close(self) -> None:
        """The servers live as long as the transport that feeds them."""
        self.pool.close()
