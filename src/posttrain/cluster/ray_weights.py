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
hung actor is replaced through the pool (`recover`) and the replacement loads the version the pool serves before it
serves: the pool keeps a per-transport `load_one` for that (`use_weights`); the object store path sets its own. For
the memory transports `load_one` reads the flat block, which still holds the last pushed version after the push,
so a replacement needs nothing from the trainer's (moving) model. An actor whose broadcast failed because the group
broke (another member died) is alive: it loads again in a rebuilt group. A member that dies mid-broadcast fails the
trainer's send at once, but the members still waiting for their next bucket only give up at the group's timeout,
so such a push costs up to one `actor_timeout_s` more; it never hangs. The group and that retry are
cluster/group_broadcast.py's (shared with the vLLM servers' transport), reaching the pool by its public `member`,
`recover` and `lock`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Literal

from posttrain.cluster.group_broadcast import Broadcaster, Failure, Outcomes, load_all
from posttrain.cluster.ray_sampler import RaySamplerPool, SamplerPoolError, Slot
from posttrain.config.schema import Config
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


class _ActorCalls:
    """How MemoryWeights' group members are asked (group_broadcast.MemberCalls): Ray method calls, answered by
    `outcomes` (Ray runs one method of an actor at a time, so a join and the trainer's end cannot be one call)."""

    def __init__(self, weights: MemoryWeights):
        self.weights = weights

    def key(self, slot: Slot) -> object:
        return (slot.rank, slot.handle)  # a replaced actor (a new handle) is a new member

    def join(self, slots: Sequence[Slot], invitations: list[str]) -> Outcomes:
        calls = [s.handle.join_weight_group.remote(inv) for s, inv in zip(slots, invitations)]
        return lambda: self.weights.outcomes(calls)

    def receive(self, slots: Sequence[Slot], layout: str) -> Outcomes:
        calls = [s.handle.load_from_group.remote(layout, self.weights.version) for s in slots]
        return lambda: self.weights.outcomes(calls)


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
        # The group's store listens on this node's address only; the group is always gloo (module docstring).
        self.groups = Broadcaster(_ActorCalls(self), self.host, "gloo", self.timeout_s, "posttrain-ray-weights")
        for slot in pool.live_slots():
            self._route(slot)  # shared_memory with an actor on another node: refused now, not at the first push

    # ---- WeightSync ------------------------------------------------------------------------------------------
    def push(self, version: int) -> dict[str, float]:
        t0 = time.perf_counter()
        state = _named_state(self.model, self.full_hf)
        # The pool's lock: a replacement made by a sample call's recovery (another thread in async mode) reads the
        # flat block and opens groups through `load_one`; it must not see a half-filled block or a half-built group.
        with self.pool.lock:
            self._write(state)
            t_fill = time.perf_counter() - t0
            self.version = version
            self.pool.use_weights(self.load_one)  # an actor replaced from now on loads this version
            self._load_all()
            self.pool.set_version(version)
            routes = [self._route(s) for s in self.pool.live_slots()]
        assert self.flat is not None
        return {
            "time/weight_sync": time.perf_counter() - t0,
            "time/weight_sync_fill": t_fill,
            "cluster/weight_mb": wt.total_bytes(self.flat.specs) / 1e6,
            "cluster/weight_shared_actors": float(routes.count("shared")),
            "cluster/weight_group_actors": float(routes.count("group")),
            "cluster/weight_group_rebuilds": float(self.groups.rebuilds),
            **self.pool.metrics(),
        }

    def load_one(self, slot: Slot) -> None:
        """One actor loads the last pushed version (a replacement, or an actor caught serving an old one) the way
        its node allows; raises if it cannot. Through the group, it joins a group of its own, dropped after; it
        leaves the push path's group for it, so that one is rebuilt at the next push."""
        assert self.flat is not None, "load_one before the first push"
        if self._route(slot) == "shared":
            failures = self.outcomes([slot.handle.load_from_shared.remote(self._shared_layout(), self.version)])
        else:
            failures = self.groups.alone(slot, self.flat, self.buckets)
        if failures:
            raise next(iter(failures.values())).error

    def close(self) -> None:
        """The actors first (they stop reading the block), then the group and the block."""
        self.pool.close()
        self.groups.release()
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
        """Every live actor loads the flat block (cluster/group_broadcast.py load_all): a dead or hung actor is
        replaced through the pool (it loads by `load_one`) or retired; an alive one that the broken group failed
        loads again in a rebuilt group, for as many rounds as the pool's restarts allow."""
        rounds = self.pool.cc.max_restarts + 2

        def fail(pending: list[Slot], last: Failure) -> SamplerPoolError:
            return SamplerPoolError(
                f"{len(pending)} live sampler actors did not load policy version {self.version} in {rounds} rounds "
                f"(last: {last.error})"
            )

        load_all(self.pool, self.pool.live_slots(), self._round, rounds, fail)

    def _round(self, slots: list[Slot]) -> dict[int, Failure]:
        """`slots` load: those on this node from the block, while the others load by one broadcast. A shared-memory
        load that raised is a bug to see (the sampler raised on a local copy), not a transport failure."""
        assert self.flat is not None
        shared = [i for i, s in enumerate(slots) if self._route(s) == "shared"]
        grouped = [i for i, s in enumerate(slots) if self._route(s) == "group"]
        layout = self._shared_layout()
        shm_calls = [slots[i].handle.load_from_shared.remote(layout, self.version) for i in shared]
        failures = self.groups.round([slots[i] for i in grouped], self.flat, self.buckets)
        out = {grouped[j]: f for j, f in failures.items()}
        for j, f in self.outcomes(shm_calls).items():
            if f.why == "failed":
                raise f.error.as_instanceof_cause()  # type: ignore[attr-defined]  # a RayTaskError
            out[shared[j]] = f
        return out

    def outcomes(self, calls: list[Any]) -> dict[int, Failure]:
        """The failed ones among `calls` (object refs), by index, waiting at most `actor_timeout_s` for all."""
        if not calls:
            return {}
        ray = self.pool.ray
        exc = ray.exceptions
        ready, _ = ray.wait(calls, num_returns=len(calls), timeout=self.timeout_s)
        done = set(ready)
        failures: dict[int, Failure] = {}
        for i, ref in enumerate(calls):
            if ref not in done:
                failures[i] = Failure(
                    "timeout",
                    TimeoutError(
                        f"a sampler actor did not load weights within cluster.actor_timeout_s={self.timeout_s:g}s"
                    ),
                )
                continue
            try:
                ray.get(ref, timeout=self.timeout_s)
            except exc.RayActorError as e:
                failures[i] = Failure("dead", e)
            except exc.RayTaskError as e:
                failures[i] = Failure("failed", e)
            except exc.GetTimeoutError as e:
                failures[i] = Failure("timeout", e)
        return failures

    def _shared_layout(self) -> str:
        assert self.flat is not None
        return wt.layout_json(self.flat.specs, shm=self.flat.name)
