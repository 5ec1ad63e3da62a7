"""RaySamplerPool: the `Sampler` protocol (sampling/base.py) over N Ray sampler actors.

    pool = RaySamplerPool.start(cfg, tokenizer)     connect (or start) Ray, reserve a placement group, start actors
    await pool.sample(prompts_P, params, n)          rows split across the live actors, reassembled in order
    pool.load_weights(ref, version)                  every live actor loads the object-store state (ray_weights.py)
    pool.use_weights(load_one)                       another transport (ray_weights.py MemoryWeights) says how one
                                                     actor loads what the pool serves: replacements and stale actors
    pool.recover(slot, failed, why)                  a dead or hung actor replaced (or its slot retired); `lock`
                                                     held by a transport's whole push
    pool.close()                                     actors, placement group, and Ray if this run started it

Each actor (sampler_worker.py) holds its own copy of the policy, placed in its own placement-group bundle (spread
across nodes by default). Like HFSampler, concurrent `sample` calls made in one event-loop turn are coalesced, so
the P x G one-prompt calls of a step's rollouts become one split of P x G rows (G copies of a prompt mostly land on
one actor, which prefills the prompt once).

Failure: an actor that dies (RayActorError) or does not answer within `cluster.actor_timeout_s` is replaced in its
bundle, given the current weights, and its share of the rows is sampled again; after `cluster.max_restarts`
replacements a slot is retired and the live actors take its share; with none left the call fails. A result stamped
with an older policy version than the pool served when the call was made (an actor that missed a push) is
sampled again after the actor reloads the current weights. Replacements are counted (`cluster/actor_restarts`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from posttrain.cluster.ray_runtime import RaySession, placement_group
from posttrain.cluster.sampler_worker import SamplerWorker
from posttrain.config.schema import Config
from posttrain.sampling.coalesce import Coalescer
from posttrain.sampling.context import ContextBudget
from posttrain.types import Completion, SampleParams


class SamplerPoolError(RuntimeError):
    """The pool could not get a call's completions: every actor is retired, or a share failed too often."""


@dataclass
class Slot:
    """One placement-group bundle and the actor currently living in it."""

    rank: int
    handle: Any
    node_id: str = ""
    incarnation: int = 0  # replacements so far
    retired: bool = False


def split(n: int, k: int) -> list[tuple[int, int]]:
    """[start, stop) spans cutting n rows into k contiguous, near-equal shares (empty ones dropped)."""
    bounds = [round(i * n / k) for i in range(k + 1)]
    return [(a, b) for a, b in itertools.pairwise(bounds) if b > a]


class RaySamplerPool:
    def __init__(self, cfg: Config, tokenizer: Any, session: RaySession, pg: Any):
        self.cfg, self.cc = cfg, cfg.cluster
        self.tokenizer = tokenizer
        self.session, self.ray, self.pg = session, session.ray, pg
        self.policy_version = -1  # nothing pushed yet; the WeightSync's first push sets it
        self.restarts = 0
        self.slots: list[Slot] = []
        self._weights: tuple[Any, int] | None = None  # object store: (ref, version); the ref keeps the object alive
        # Loads the weights the pool serves into one actor (raises if it cannot): set by the weight transport at
        # each push, before the actors load, so an actor replaced mid-push or later loads the current version.
        self._load_one: Callable[[Slot], None] | None = None
        # Slot replacement, and a transport's whole push (ray_weights.py MemoryWeights holds it): the sync runs in a
        # thread in async mode.
        self.lock = threading.RLock()
        self._remote = self.ray.remote(SamplerWorker)
        self.context: ContextBudget | None = None  # the actors' (start reads it from them)
        self._coalescer = Coalescer(self.sample_rows)
        self._closed = False

    @classmethod
    def start(cls, cfg: Config, tokenizer: Any) -> RaySamplerPool:
        session = RaySession.connect(cfg.cluster)
        pool = None
        try:
            pool = cls(cfg, tokenizer, session, placement_group(session.ray, cfg.cluster))
            handles = [pool._spawn(r, 0) for r in range(cfg.cluster.num_samplers)]
            infos = pool._get([h.ready.remote() for h in handles], "start")
            pool.slots = [Slot(r, h, info["node_id"]) for r, (h, info) in enumerate(zip(handles, infos))]
            # Rows are fitted to the actors' context here, per caller, so one long prompt fails alone.
            pool.context = ContextBudget(min(info["max_context"] for info in infos), cfg.sampling.context_overflow)
            pool._coalescer = Coalescer(pool.sample_rows, pool.context)
            return pool
        except BaseException:
            if pool is not None:
                pool.close()
            else:
                session.close()
            raise

    # ---- Sampler protocol ------------------------------------------------------------------------------------
    def set_version(self, version: int) -> None:
        """The version the actors serve now (the transport, once every actor loaded it)."""
        self.policy_version = version

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    async def sample(self, prompts_P: list[list[int]], params: SampleParams, n: int = 1) -> list[list[Completion]]:
        return await self._coalescer.sample(prompts_P, params, n)

    async def sample_rows(self, rows: list[list[int]], params: SampleParams) -> list[Completion]:
        """One completion per row, in order, from the live actors; failed shares are sampled again."""
        ray_exc = self.ray.exceptions
        floor = self.policy_version  # no result may come from an older policy than the pool serves now
        out: list[Completion | None] = [None] * len(rows)
        live = self.live_slots() or [self._any_live()]  # none: _any_live raises the pool's error
        todo = [(live[k], span) for k, span in enumerate(split(len(rows), len(live)))]
        tries = {span: 0 for _, span in todo}
        while todo:
            results = await asyncio.gather(*(self._call(slot, rows[a:b], params) for slot, (a, b) in todo))
            again = []
            for (slot, span), (handle, res) in zip(todo, results):
                if isinstance(res, ray_exc.RayTaskError):
                    # the sampler itself raised (a bad prompt): not a failure of the actor
                    raise res.as_instanceof_cause()
                if isinstance(res, BaseException) and not isinstance(res, (ray_exc.RayActorError, TimeoutError)):
                    raise res
                if (
                    isinstance(res, list)
                    and len(res) == span[1] - span[0]
                    and all(c.policy_version >= floor for c in res)
                ):
                    out[span[0] : span[1]] = res
                    continue
                why = "stale" if isinstance(res, list) else "timeout" if isinstance(res, TimeoutError) else "dead"
                tries[span] += 1
                if tries[span] > self.cc.max_restarts + 1:
                    raise SamplerPoolError(
                        f"rows {span[0]}-{span[1]} failed {tries[span]} times on sampler actors "
                        f"(last: {why}: {res if why != 'stale' else 'an old policy version'})"
                    )
                again.append((await asyncio.to_thread(self.recover, slot, handle, why), span))
            todo = again
        return out  # type: ignore[return-value]  # every span was filled or the call raised

    async def _call(self, slot: Slot, rows: list[list[int]], params: SampleParams) -> tuple[Any, Any]:
        """(the handle called, its completions or the exception): the handle says which incarnation failed."""
        handle = slot.handle
        try:
            ref = handle.sample_rows.remote(rows, params)
            return handle, await asyncio.wait_for(asyncio.wrap_future(ref.future()), self.cc.actor_timeout_s)
        except Exception as e:  # noqa: BLE001 - sorted by the caller: retried, or raised
            return handle, e

    # ---- weights ---------------------------------------------------------------------------------------------
    def load_weights(self, ref: Any, version: int) -> None:
        """Every live actor loads the object-store state `ref` as `version` (bounded waits; an actor that dies or
        hangs is replaced and loads it as it starts). Afterwards the pool serves `version`."""
        with self.lock:
            self._weights = (ref, version)
            self._load_one = lambda slot: self._get(slot.handle.load_weights.remote(ref, version), "load weights")
        ray_exc = self.ray.exceptions
        for _ in range(self.cc.max_restarts + 2):
            calls = [(s, s.handle, s.handle.load_weights.remote(ref, version)) for s in self.live_slots()]
            failed = []
            for slot, handle, call in calls:
                try:
                    self.ray.get(call, timeout=self.cc.actor_timeout_s)
                except (ray_exc.RayActorError, ray_exc.GetTimeoutError) as e:
                    failed.append((slot, handle, "timeout" if isinstance(e, TimeoutError) else "dead"))
            for slot, handle, why in failed:
                self.recover(slot, handle, why)  # a replacement loads `ref` (self._load_one) before it serves
            if not failed:
                self.policy_version = version
                return
        raise SamplerPoolError(
            f"sampler actors did not load policy version {version} in "
            f"{self.cc.max_restarts + 2} rounds of {self.cc.actor_timeout_s:g}s"
        )

    def use_weights(self, load_one: Callable[[Slot], None]) -> None:
        """How one actor loads the weights the pool serves from now on (`load_one(slot)` raises when it cannot),
        for a transport that is not `load_weights`: a replacement loads through it before it serves, and so does
        an actor caught serving an old version. The transport sets `policy_version` once its live actors loaded."""
        with self.lock:
            self._weights = None
            self._load_one = load_one

    # ---- failure (cluster/group_broadcast.py RecoveringPool: `member`, `recover`) --------------------------------
    def member(self, slot: Slot) -> Any:
        """The actor `slot` holds now."""
        return slot.handle

    def recover(self, slot: Slot, failed: Any, why: str) -> Slot:
        """After `failed` (slot's actor at call time) died, hung or served an old version: the slot to retry on.
        A stale actor reloads the current weights; a dead or hung one is replaced in its bundle (it loads them on
        start); a slot out of replacements is retired and another live slot takes the share."""
        with self.lock:
            if slot.handle is not failed:  # another caller already replaced it
                return slot if not slot.retired else self._any_live()
            if why == "stale" and self._reload(slot):
                return slot
            with contextlib.suppress(Exception):  # a hung actor must not answer later; a dead one is gone already
                self.ray.kill(failed)
            if slot.incarnation >= self.cc.max_restarts:
                slot.retired = True
                return self._any_live()
            slot.incarnation += 1
            self.restarts += 1
            slot.handle = self._spawn(slot.rank, slot.incarnation)
            try:
                slot.node_id = self._get(slot.handle.ready.remote(), "restart")["node_id"]
                loaded = self._reload(slot)
            except (TimeoutError, self.ray.exceptions.RayActorError):
                loaded = False  # the bundle could not host a new actor in time
            if not loaded:  # retired: the others carry on, and the half-started actor must not hold the bundle
                slot.retired = True
                with contextlib.suppress(Exception):
                    self.ray.kill(slot.handle)
                return self._any_live()
            return slot

    def _reload(self, slot: Slot) -> bool:
        """Load the weights the pool serves into one actor; False if it dies or does not answer in time."""
        if self._load_one is None:  # nothing pushed yet
            return True
        try:
            self._load_one(slot)
            return True
        except Exception:  # noqa: BLE001 - the caller replaces or retires the actor
            return False

    def _any_live(self) -> Slot:
        live = self.live_slots()
        if not live:
            raise SamplerPoolError(
                f"every sampler actor is retired ({self.cc.num_samplers} slots, "
                f"{self.restarts} replacements, cluster.max_restarts={self.cc.max_restarts} each)"
            )
        return min(live, key=lambda s: s.rank)

    # ---- actors ----------------------------------------------------------------------------------------------
    def _spawn(self, rank: int, incarnation: int) -> Any:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        res = self.cc.sampler_resources
        strategy = PlacementGroupSchedulingStrategy(placement_group=self.pg, placement_group_bundle_index=rank)
        # max_restarts=0: the pool replaces dead actors itself, so it knows to reload weights and re-issue rows.
        # In-flight updates on a vLLM actor: a weight load must run while a sample call generates (the engine applies
        # it between tokens), so such an actor takes two calls at once; the engine orders them itself.
        in_flight = self.cfg.sampling.engine == "vllm" and self.cfg.sampling.vllm.weight_update == "in_flight"
        return self._remote.options(
            num_cpus=res.num_cpus,
            num_gpus=res.num_gpus,
            max_restarts=0,
            max_concurrency=2 if in_flight else 1,
            scheduling_strategy=strategy,
        ).remote(self.cfg, rank, incarnation)

    def _get(self, refs: Any, what: str) -> Any:
        try:
            return self.ray.get(refs, timeout=self.cc.actor_timeout_s)
        except self.ray.exceptions.GetTimeoutError:
            raise TimeoutError(
                f"sampler actors did not {what} within cluster.actor_timeout_s={self.cc.actor_timeout_s:g}s"
            ) from None

    def live_slots(self) -> list[Slot]:
        return [s for s in self.slots if not s.retired]

    def metrics(self) -> dict[str, float]:
        return {"cluster/actor_restarts": float(self.restarts), "cluster/samplers_alive": float(len(self.live_slots()))}

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # Ray may already be down (a node lost, a crash): closing must not hide the run's own error.
        with contextlib.suppress(Exception):
            for s in self.slots:
                self.ray.kill(s.handle)
            self.ray.util.remove_placement_group(self.pg)
        self.session.close()
