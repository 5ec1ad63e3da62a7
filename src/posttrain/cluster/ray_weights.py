"""Weight syncs for Ray sampler actors (cluster/ray_sampler.py): the `WeightSync` (loop/weight_sync.py) that brings
each step's weights from the trainer into every actor. `ray_weight_sync(cfg, model, pool)` picks one by
`cluster.weight_transport`.

- `ObjectStoreWeights` (weight_transport=object_store): each push puts the state into the Ray object store once
  (`ray.put`) and has every live actor load that one object (RaySamplerPool.load_weights). Works wherever Ray does,
  but the state is pickled into the store and copied out again by every actor, on the trainer's node as elsewhere.
- `MemoryWeights` (auto, shared_memory, group): the way verl and OpenRLHF move weights. The state is copied once into
  one flat shared-memory block (sampling/weight_transfer.py FlatWeights; the trainer's dtype, as the object store
  path sends it), then
    - an actor on the trainer's own node maps that block by name and copies the tensors in (`load_from_shared`): no
      serialisation, no object store, the actors load in parallel;
    - an actor on another node receives it by a bucketed broadcast over a gloo group of the trainer (rank 0) and
      those actors (ranks 1..K), over a TCPStore the trainer hosts (`join_weight_group`, then `load_from_group` at
      each push): the bytes cross the network once per actor, pipelined bucket by bucket.
  `auto` picks per actor by node; `shared_memory` and `group` force one path for all (shared_memory refuses an actor
  on another node). The group is kept between pushes while its members (slot, actor) stay the same, and dropped
  after any failure.

Why not the object store everywhere: a push there is a pickle into the store, then per actor a copy out of it (and
across the network for another node) and an unpickle, all before the first tensor is loaded. The flat block is one
copy whatever the number of actors; same-node actors read it in place, and the group streams it so an actor loads
bucket k while bucket k+1 is on the wire. The group is always gloo (host memory on both ends: the trainer's block,
the actors' CPU or vLLM loaders), so it needs no GPU anywhere. Its store listens on this node's address only;
gloo's sockets bind to the address the host name resolves to (on hosts where that is a loopback address set
GLOO_SOCKET_IFNAME, as for any gloo group). Each actor is invited with the group's secret in its
`join_weight_group` call and checks every bucket against the digest sent with the layout (sampling/weight_group.py),
so a process that reaches the store but is not a member is refused before it is sent anything and cannot make an
actor load forged weights. Under Ray Client (cluster.address=ray://) this process shares no node with the actors,
so `auto` sends every actor the group, whose store the actors must be able to reach at this machine's address.

What moves is `trainable_state` (sampling/weight_ipc.py) for actors with their own sampler: under LoRA only the
adapter tensors, the frozen base being identical in every actor (each loads the same model from the same config);
without LoRA, every weight. vLLM engines in actors take every weight under its HF name (a LoRA model merged;
sampling/vllm_weights.py `hf_state`).

Failure, for both: every wait is bounded by `cluster.actor_timeout_s` (the gloo group's own timeout too). A dead or
hung actor is replaced through the pool (`_recover`) and the replacement loads the version the pool serves before it
serves: the pool keeps a per-transport `load_one` for that (`use_weights`); the object store path sets its own. For
the memory transports `load_one` reads the flat block, which still holds the last pushed version after the push,
so a replacement needs nothing from the trainer's (moving) model. An actor whose broadcast failed because the group
broke (another member died) is alive: it loads again in a rebuilt group. A member that dies mid-broadcast fails the
trainer's send at once, but the members still waiting for their next bucket only give up at the group's timeout,
so such a push costs up to one `actor_timeout_s` more; it never hangs.
"""

from __future__ import annotations

import itertools
import os
import time
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from posttrain.cluster.ray_sampler import RaySamplerPool, SamplerPoolError, Slot
from posttrain.config.schema import Config
from posttrain.sampling import weight_group as wg
from posttrain.sampling import weight_transfer as wt
from posttrain.sampling.weight_ipc import trainable_state

MEMORY_TRANSPORTS = ("auto", "shared_memory", "group")


def ray_weight_sync(cfg: Config, model: Any, pool: RaySamplerPool) -> ObjectStoreWeights | MemoryWeights:
    """The WeightSync `cluster.weight_transport` asks for, feeding `pool`'s actors from `model`."""
    cc = cfg.cluster
    full_hf = cfg.sampling.engine == "vllm"
    if cc.weight_transport == "object_store":
        return ObjectStoreWeights(model, pool, full_hf=full_hf)
    return MemoryWeights(
        model,
        pool,
        full_hf=full_hf,
        transport=cc.weight_transport,
        bucket_mb=cc.weight_bucket_mb,
        dtype=cfg.sampling.vllm.dtype if full_hf else None,
    )


def _named_state(model: Any, full_hf: bool) -> dict[str, Any]:
    """The tensors a push moves (no copy yet): every weight under its HF name for vLLM engines, else the
    trainable ones."""
    if full_hf:
        from posttrain.sampling.vllm_weights import hf_state

        return hf_state(model)
    return trainable_state(model)


class ObjectStoreWeights:
    def __init__(self, model: Any, pool: RaySamplerPool, full_hf: bool = False):
        """`model`: the trainer's; `pool`: the sampler actors that must serve it; `full_hf`: the actors run vLLM
        engines, which take every weight under its HF name (a LoRA model merged; sampling/vllm_weights.py)."""
        self.model, self.pool, self.full_hf = model, pool, full_hf

    def push(self, version: int) -> dict[str, float]:
        t0 = time.perf_counter()
        state = {n: t.to("cpu", copy=True) for n, t in _named_state(self.model, self.full_hf).items()}
        ref = self.pool.ray.put(state)  # once per version, whatever the number of actors
        t_put = time.perf_counter() - t0
        self.pool.load_weights(ref, version)
        return {
            "time/weight_sync": time.perf_counter() - t0,
            "time/weight_sync_put": t_put,
            "cluster/weight_mb": sum(t.numel() * t.element_size() for t in state.values()) / 1e6,
            **self.pool.metrics(),
        }

    def close(self) -> None:
        """The actors live as long as the transport that feeds them: the run's end stops them (and Ray, when the
        run started it)."""
        self.pool.close()


# ---- shared memory and the group --------------------------------------------------------------------------
Route = Literal["shared", "group"]  # how one actor gets the block


class _Failure(NamedTuple):
    """One actor's failed call: `dead` (the actor is gone), `timeout` (no answer in time: hung or stuck) or
    `failed` (the actor is alive and its method raised, e.g. its group broke)."""

    why: str
    error: BaseException


@dataclass
class _Group:
    """The trainer's end of a weight group and who is in it: (slot rank, actor handle) for ranks 1..K in order."""

    members: tuple[tuple[int, Any], ...]
    group: wg.WeightGroup  # this process's end (rank 0); its store lives as long as the group

    def serves(self, slots: list[Slot]) -> bool:
        """The same actors in the same order: a replaced actor (a new handle) is a new member."""
        return len(slots) == len(self.members) and all(
            s.rank == r and s.handle is h for s, (r, h) in zip(slots, self.members)
        )


_GROUP_IDS = itertools.count()


class MemoryWeights:
    def __init__(
        self,
        model: Any,
        pool: RaySamplerPool,
        full_hf: bool = False,
        transport: str = "auto",
        bucket_mb: float = wt.DEFAULT_BUCKET_MB,
        dtype: str | None = None,
    ):
        """`model`, `pool`, `full_hf`: as for ObjectStoreWeights. `transport`: auto (shared memory for the actors
        on this node, the group for the others), shared_memory or group (one path for every actor). `bucket_mb`:
        the broadcast's bucket size (an actor loads one while the next is on the wire). `dtype`: the engines'
        (vLLM actors: sampling.vllm.dtype; a bf16 engine is sent half the bytes), None: the trainer's."""
        if transport not in MEMORY_TRANSPORTS:
            raise ValueError(f"MemoryWeights transport must be one of {MEMORY_TRANSPORTS}, got {transport!r}")
        self.model, self.pool, self.full_hf, self.transport, self.dtype = model, pool, full_hf, transport, dtype
        self.bucket_bytes = int(bucket_mb * 2**20)
        self.timeout_s = pool.cc.actor_timeout_s
        ray = pool.ray
        # Under Ray Client (ray://) this process is on none of the cluster's nodes: no actor shares its memory.
        self.node_id = None if pool.cc.address.startswith("ray://") else ray.get_runtime_context().get_node_id()
        self.host = ray.util.get_node_ip_address()  # where the actors reach this process's TCPStore
        self.flat: wt.FlatWeights | None = None
        self.buckets: list[tuple[int, int]] = []
        self.version = -1
        self.group: _Group | None = None  # the push path's group, kept while its members stay
        self.rebuilds = 0
        for slot in pool.live_slots():
            self._route(slot)  # shared_memory with an actor on another node: refused now, not at the first push

    # ---- WeightSync ------------------------------------------------------------------------------------------
    def push(self, version: int) -> dict[str, float]:
        t0 = time.perf_counter()
        state = _named_state(self.model, self.full_hf)
        # The pool's lock: a replacement made by a sample call's recovery (another thread in async mode) reads the
        # flat block and opens groups through `load_one`; it must not see a half-filled block or a half-built group.
        with self.pool._lock:
            self._write(state)
            t_fill = time.perf_counter() - t0
            self.version = version
            self.pool.use_weights(self.load_one)  # an actor replaced from now on loads this version
            self._load_all()
            self.pool.policy_version = version
            routes = [self._route(s) for s in self.pool.live_slots()]
        assert self.flat is not None
        return {
            "time/weight_sync": time.perf_counter() - t0,
            "time/weight_sync_fill": t_fill,
            "cluster/weight_mb": wt.total_bytes(self.flat.specs) / 1e6,
            "cluster/weight_shared_actors": float(routes.count("shared")),
            "cluster/weight_group_actors": float(routes.count("group")),
            "cluster/weight_group_rebuilds": float(self.rebuilds),
            **self.pool.metrics(),
        }

    def load_one(self, slot: Slot) -> None:
        """One actor loads the last pushed version (a replacement, or an actor caught serving an old one) the way
        its node allows; raises if it cannot. Through the group, it joins a group of its own, dropped after; it
        leaves the push path's group for it, so that one is rebuilt at the next push."""
        assert self.flat is not None, "load_one before the first push"
        if self._route(slot) == "shared":
            failures = self._outcomes([slot.handle.load_from_shared.remote(self._shared_layout(), self.version)])
        else:
            self.group = None
            group, failures = self._open([slot])
            if group is not None:
                failures = self._broadcast(group, [slot])
        if failures:
            raise next(iter(failures.values())).error

    def close(self) -> None:
        """The actors first (they stop reading the block), then the group and the block."""
        self.pool.close()
        self.group = None
        if self.flat is not None:
            self.flat.close()
            self.flat = None

    # ---- one push ----------------------------------------------------------------------------------------------
    def _route(self, slot: Slot) -> Route:
        if self.transport == "group":
            return "group"
        if slot.node_id and slot.node_id == self.node_id:
            return "shared"
        if self.transport == "shared_memory":
            raise SamplerPoolError(
                f"cluster.weight_transport=shared_memory: sampler actor {slot.rank} is on node {slot.node_id[:12]}, "
                f"not this process's ({(self.node_id or 'none: Ray Client')[:12]}), and cannot map its memory; use "
                "cluster.weight_transport=auto or group"
            )
        return "group"

    def _write(self, state: dict[str, Any]) -> None:
        """The state cast into the flat block; laid out at the first push (the same model every push)."""
        if self.flat is None:
            self.flat = wt.FlatWeights(wt.engine_specs(state, self.dtype), shared=True)
            self.buckets = wt.plan_buckets(self.flat.specs, self.bucket_bytes)
        self.flat.fill(state)

    def _load_all(self) -> None:
        """Every live actor loads the flat block. Shared-memory loads run while the group broadcasts. After a
        failure, a dead or hung actor is replaced through the pool (it loads by `load_one`) or retired; an alive
        one that the broken group failed loads again in a rebuilt group, for as many rounds as the pool's
        restarts allow."""
        pool = self.pool
        pending = pool.live_slots()
        for _ in range(pool.cc.max_restarts + 2):
            shared = [(s, s.handle) for s in pending if self._route(s) == "shared"]
            grouped = [s for s in pending if self._route(s) == "group"]
            layout = self._shared_layout()
            shm_calls = [h.load_from_shared.remote(layout, self.version) for _, h in shared]
            failed = [(grouped[i], grouped[i].handle, f) for i, f in self._group_round(grouped).items()]
            for i, f in self._outcomes(shm_calls).items():
                if f.why == "failed":  # the sampler raised on a local copy: a bug to see, not a transport failure
                    raise f.error.as_instanceof_cause()  # type: ignore[attr-defined]  # a RayTaskError
                failed.append((shared[i][0], shared[i][1], f))
            if not failed:
                return
            retry = []
            for slot, handle, f in failed:
                if f.why == "failed":
                    retry.append(slot)
                else:
                    pool._recover(slot, handle, f.why)  # replaced (loading by load_one) or retired
            pending = [s for s in retry if not s.retired]
            if not pending:
                return
        raise SamplerPoolError(
            f"{len(pending)} live sampler actors did not load policy version {self.version} in "
            f"{pool.cc.max_restarts + 2} rounds (last: {failed[-1][2].error})"
        )

    def _group_round(self, slots: list[Slot]) -> dict[int, _Failure]:
        """`slots` load by one broadcast, in the cached group when it holds exactly them; failures by index."""
        if not slots:
            return {}
        if self.group is None or not self.group.serves(slots):
            self.group = None  # its sockets close; its members replace it as they join the next
            group, failures = self._open(slots)
            if group is None:
                return failures
            self.group = group
        failures = self._broadcast(self.group, slots)
        if failures:
            self.group = None  # a broadcast failed midway: no member can be trusted to be in step
        return failures

    def _open(self, slots: list[Slot]) -> tuple[_Group | None, dict[int, _Failure]]:
        """A group of this process (rank 0) and `slots`' actors (ranks 1..K): the actors' joins are in flight
        while this thread opens its end (Ray runs one method of an actor at a time, so it cannot be one call)."""
        store = wg.host_store(self.host, self.timeout_s)  # listening on this node's address only
        name = f"posttrain-ray-weights-{os.getpid()}-{next(_GROUP_IDS)}"
        inv = wg.Invitation(self.host, store.port, name, wg.new_token(), 0, len(slots) + 1, "gloo", self.timeout_s)
        calls = [s.handle.join_weight_group.remote(inv.for_rank(i + 1).to_json()) for i, s in enumerate(slots)]
        try:
            group = wg.open_group(inv, store)  # raises when a member never comes or is not a member
        except Exception as e:  # noqa: BLE001 - who is at fault is read from the joins
            return None, self._outcomes(calls) or dict.fromkeys(range(len(slots)), _Failure("failed", e))
        failures = self._outcomes(calls)
        if failures:
            return None, failures
        self.rebuilds += 1
        return _Group(tuple((s.rank, s.handle) for s in slots), group), {}

    def _broadcast(self, group: _Group, slots: list[Slot]) -> dict[int, _Failure]:
        """The flat block to every member: their receives are in flight while this thread sends."""
        assert self.flat is not None
        nonce = wg.new_nonce()
        digests = wg.bucket_digests(group.group, nonce, self.flat.data, self.buckets)
        layout = wt.layout_json(self.flat.specs, self.buckets, name=group.group.name, nonce=nonce, digests=digests)
        calls = [s.handle.load_from_group.remote(layout, self.version) for s in slots]
        try:
            wg.send_flat(group.group, self.flat.data, self.buckets)
        except Exception as e:  # noqa: BLE001 - a peer died or the group timed out: the members' answers say which
            send_error: BaseException | None = e
        else:
            send_error = None
        failures = self._outcomes(calls)
        if send_error is not None and not failures:
            failures = dict.fromkeys(range(len(slots)), _Failure("failed", send_error))
        return failures

    def _outcomes(self, calls: list[Any]) -> dict[int, _Failure]:
        """The failed ones among `calls` (object refs), by index, waiting at most `actor_timeout_s` for all."""
        if not calls:
            return {}
        ray = self.pool.ray
        exc = ray.exceptions
        ready, _ = ray.wait(calls, num_returns=len(calls), timeout=self.timeout_s)
        done = set(ready)
        failures: dict[int, _Failure] = {}
        for i, ref in enumerate(calls):
            if ref not in done:
                failures[i] = _Failure(
                    "timeout",
                    TimeoutError(
                        f"a sampler actor did not load weights within cluster.actor_timeout_s={self.timeout_s:g}s"
                    ),
                )
                continue
            try:
                ray.get(ref, timeout=self.timeout_s)
            except exc.RayActorError as e:
                failures[i] = _Failure("dead", e)
            except exc.RayTaskError as e:
                failures[i] = _Failure("failed", e)
            except exc.GetTimeoutError as e:
                failures[i] = _Failure("timeout", e)
        return failures

    def _shared_layout(self) -> str:
        assert self.flat is not None
        return wt.layout_json(self.flat.specs, shm=self.flat.name)
