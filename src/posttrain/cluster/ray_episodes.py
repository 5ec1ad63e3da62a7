"""Env workers on Ray (`cluster.envs=ray`): every episode's tools, and their state, live on a Ray actor.

    workers = EnvWorkers.start(cc, task)        connect (or start) Ray, start cluster.num_env_workers actors (spread)
    env = remote_env(task, workers, tok, params) the task's env, its episodes opened on the workers, re-issued on loss
    workers.drain_metrics(); workers.close()

What moves: the tool side of a tool task (envs/tool_env.py). The policy, the sampler and the episode loop stay in
the driver; each rollout's `Task.episode(row)` object (its own copy of a repository, a game's state) is built on
one worker, every tool call of that rollout goes to it, and its `finish` (the final grade) runs there. A task
whose tools have no per-episode state gets one stateless episode per rollout, so its tool calls run on the workers
too. The token stream is unchanged: the driver renders the tool messages exactly as for local tools.

Why actors, not tasks (grading uses tasks, ray_grading.py): an episode's state lives across its calls, so they
must reach one process. Each actor is threaded (`cluster.env_worker_concurrency`), so a slow or hung tool holds
one thread, not the worker's other episodes.

Failure: a worker that dies (SIGKILL, a lost node) raises RayActorError at the next call of each of its episodes;
a worker that does not answer `open` (its start included) or `finish` within `cluster.actor_timeout_s` counts as
hung and is killed.
Either way its slot gets a new actor (at most `cluster.max_restarts` times, then the slot is retired and the live
ones take the new episodes) and each affected episode raises EnvWorkerLost: `ReissueOnLoss` runs that rollout
again from its start (a fresh episode, freshly sampled), so no group loses a member. A tool call that hangs on a
live worker is the tool's own timeout, reported to the model, as locally. No call waits without a timeout.
A rollout that raises in the driver before its episode finished (one failed sample, envs/isolate.py: the run goes
on) discards the episode on its worker (ToolEnv calls `discard`), so failed samples leave nothing open there.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import inspect
import os
import sys
import threading
import time
import uuid
from collections.abc import Awaitable
from typing import Any

from posttrain.cluster.ray_runtime import RaySession
from posttrain.config.schema import ClusterConfig
from posttrain.envs.tool_env import finish_episode
from posttrain.envs.tools import EnvWorkerLost, Tool
from posttrain.rewards.rubric import Score
from posttrain.sampling.base import Sampler
from posttrain.types import SampleParams, Trajectory


class EnvWorkerPoolError(EnvWorkerLost):
    """No env worker is left (every slot retired past cluster.max_restarts), or one rollout lost its worker more
    often than cluster.max_restarts allows. An EnvWorkerLost, so call_tool lets it through to the rollout, which
    does not run again: the run stops with this error."""


def _as_tools(items: list[Any]) -> dict[str, Tool]:
    return {t.name: t for t in (x if isinstance(x, Tool) else Tool.from_function(x) for x in items)}


@dataclasses.dataclass
class StatelessEpisode:
    """A task whose tools keep no per-episode state: the same functions serve every episode (it is its own
    factory)."""

    tools: list[Any]

    def __call__(self, row: dict[str, Any]) -> StatelessEpisode:
        return self


def _pickle_user_tasks_by_value(ray: Any) -> None:
    """A task loaded from a file (`task.name=path/to/file.py:fn`, tasks/load.py) lives in a module no worker can
    import by name; its code travels with the pickled episode factory instead."""
    from posttrain.tasks.load import USER_MODULE_PREFIX

    for name, module in list(sys.modules.items()):
        if name.startswith(USER_MODULE_PREFIX) and module is not None:
            ray.cloudpickle.register_pickle_by_value(module)


async def _awaited(aw: Awaitable[Any]) -> Any:
    """`aw` awaited: asyncio.run takes a coroutine only, and a tool may return any awaitable."""
    return await aw


class EpisodeHost:
    """The actor: the episodes opened on it, by id. Methods run on the actor's threads."""

    def __init__(self, factory: Any):
        self.factory = factory
        self.episodes: dict[str, tuple[Any, dict[str, Tool]]] = {}

    def ready(self) -> dict[str, Any]:
        import ray

        return {"node_id": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}

    def open(self, eid: str, row: dict[str, Any]) -> str:
        import ray

        episode = self.factory(row)
        self.episodes[eid] = (episode, _as_tools(episode.tools))
        return ray.get_runtime_context().get_node_id()

    def call(self, eid: str, name: str, args: dict[str, Any]) -> Any:
        """The tool's raw return value; what it raises comes back to the driver's call_tool as itself."""
        fn = self.episodes[eid][1][name].func
        out = fn(**args)
        return asyncio.run(_awaited(out)) if inspect.isawaitable(out) else out

    def finish(self, eid: str, final_call: dict[str, Any] | None) -> Any:
        episode, _ = self.episodes.pop(eid)
        return asyncio.run(finish_episode(episode, final_call))

    def discard(self, eid: str) -> None:
        """Drop an episode that will never finish (its rollout raised in the driver), without grading it."""
        self.episodes.pop(eid, None)

    def open_episodes(self) -> int:
        return len(self.episodes)


@dataclasses.dataclass
class Slot:
    rank: int
    handle: Any
    node_id: str = ""
    pid: int = 0
    incarnation: int = 0
    retired: bool = False
    open: int = 0  # episodes open on the current actor (the pick is the least loaded)


class EnvWorkers:
    def __init__(self, cc: ClusterConfig, task: Any, session: RaySession):
        self.cc, self.session, self.ray = cc, session, session.ray
        self.template = _as_tools(task.tools)  # names and schemas the prompt lists; the calls go to a worker
        factory = task.episode if task.episode is not None else StatelessEpisode(list(task.tools))
        _pickle_user_tasks_by_value(self.ray)
        self._factory_ref = self.ray.put(factory)  # pickled once, shared by every actor (and replacement)
        self._remote = self.ray.remote(EpisodeHost).options(
            num_cpus=cc.env_worker_num_cpus, max_concurrency=cc.env_worker_concurrency, scheduling_strategy="SPREAD"
        )
        self._lock = threading.Lock()
        self.slots: list[Slot] = []
        self._stats: dict[str, float] = collections.defaultdict(float)
        self._nodes: collections.Counter[str] = collections.Counter()

    @classmethod
    def start(cls, cc: ClusterConfig, task: Any) -> EnvWorkers:
        if task.env_factory is not None:
            raise ValueError(
                f"cluster.envs=ray moves the episodes of a tool task (Task.tools / Task.episode) to Ray "
                f"workers; task {task.name!r} builds its own env (env_factory), which stays local: set "
                "cluster.envs=local"
            )
        if not task.tools:
            raise ValueError(
                f"cluster.envs=ray runs a tool task's tools on Ray workers; task {task.name!r} has no "
                "tools (set cluster.envs=local)"
            )
        session = RaySession.connect(cc)
        workers = cls(cc, task, session)
        try:
            handles = [workers._remote.remote(workers._factory_ref) for _ in range(cc.num_env_workers)]
            refs = [h.ready.remote() for h in handles]
            ready, _ = workers.ray.wait(refs, num_returns=len(refs), timeout=cc.actor_timeout_s)
            if len(ready) < len(refs):
                raise TimeoutError(
                    f"{len(refs) - len(ready)} of {len(refs)} env workers did not start in "
                    f"{cc.actor_timeout_s:g}s (cluster resources: {workers.ray.cluster_resources()}); "
                    "lower cluster.num_env_workers or cluster.env_worker_num_cpus"
                )
            try:
                infos = workers.ray.get(refs)
            except workers.ray.exceptions.RayActorError as e:
                raise RuntimeError(
                    f"the env workers could not start: {str(e).strip().splitlines()[-1][:300]}. The task's episode "
                    "factory and tools are pickled to the workers, which import their modules by name: install the "
                    "module on every node (or ship it with Ray's runtime_env); a task file loaded with "
                    "task.name=path.py:fn travels by value"
                ) from None
            workers.slots = [Slot(r, h, i["node_id"], i["pid"]) for r, (h, i) in enumerate(zip(handles, infos))]
            return workers
        except BaseException:
            workers.close()
            raise

    # ---- episodes ----------------------------------------------------------------------------------------------
    def episode(self, row: dict[str, Any]) -> RemoteEpisode:
        """Task.episode for the driver's env: a proxy whose tools call this rollout's episode on a worker."""
        return RemoteEpisode(self, row)

    def pick(self) -> Slot:
        with self._lock:
            live = [s for s in self.slots if not s.retired]
            if not live:
                raise EnvWorkerPoolError(
                    f"every env worker is retired (each replaced cluster.max_restarts="
                    f"{self.cc.max_restarts} times); the run cannot go on"
                )
            slot = min(live, key=lambda s: s.open)
            slot.open += 1
            return slot

    async def request(self, slot: Slot, handle: Any, method: str, *args: Any, timeout: float | None) -> Any:
        """One actor call. Death (or, with a timeout, no answer) -> the slot's actor is replaced and EnvWorkerLost
        raises; what the episode's own code raised comes back as itself."""
        ray_exc = self.ray.exceptions
        t0 = time.perf_counter()
        ref = getattr(handle, method).remote(*args)
        try:
            fut = asyncio.wrap_future(ref.future())
            out = await (asyncio.wait_for(fut, timeout) if timeout is not None else fut)
        except ray_exc.RayTaskError as e:
            self._count(calls=1, seconds=time.perf_counter() - t0)
            cause = getattr(e, "cause", None)
            raise (cause if isinstance(cause, Exception) else e) from None
        except ray_exc.RayActorError as e:
            self._count(calls=1, seconds=time.perf_counter() - t0)
            await asyncio.to_thread(self.replace, slot, handle)
            raise EnvWorkerLost(f"env worker {slot.rank} died during {method} ({type(e).__name__})") from None
        except TimeoutError:
            self._count(calls=1, seconds=time.perf_counter() - t0)
            await asyncio.to_thread(self.replace, slot, handle)  # kills the hung actor, which ends the call
            raise EnvWorkerLost(
                f"env worker {slot.rank} did not answer {method} within cluster.actor_timeout_s="
                f"{self.cc.actor_timeout_s:g}s; replaced"
            ) from None
        self._count(calls=1, seconds=time.perf_counter() - t0)
        return out

    def replace(self, slot: Slot, handle: Any) -> None:
        """A new actor in `slot` unless it was already replaced (several episodes see one death), or retire it."""
        with self._lock:
            if slot.handle is not handle or slot.retired:
                return
            try:
                self.ray.kill(handle, no_restart=True)
            except Exception:  # noqa: BLE001 - already dead
                pass
            slot.open = 0
            if slot.incarnation >= self.cc.max_restarts:
                slot.retired = True
                return
            # Not waited for: the next open on this slot queues until the actor is up (bounded by its timeout).
            slot.handle = self._remote.remote(self._factory_ref)
            slot.incarnation += 1
            self._stats["restarts"] += 1

    def done(self, slot: Slot, handle: Any) -> None:
        with self._lock:
            if slot.handle is handle and slot.open > 0:
                slot.open -= 1

    # ---- metrics and lifetime ----------------------------------------------------------------------------------
    def count_reissue(self) -> None:
        self._count(reissued=1)

    def _count(self, **kv: float) -> None:
        with self._lock:
            for k, v in kv.items():
                self._stats[k] += v

    def opened_on(self, node: str) -> None:
        with self._lock:
            self._nodes[node] += 1
            self._stats["episodes"] += 1

    def drain_metrics(self) -> dict[str, float]:
        """Since the last drain: episodes opened, actor calls and their mean seconds, distinct nodes, workers
        replaced, rollouts re-issued; and the live workers now."""
        with self._lock:
            s, nodes = dict(self._stats), len(self._nodes)
            self._stats.clear()
            self._nodes.clear()
            alive = sum(not x.retired for x in self.slots)
        calls = s.get("calls", 0.0)
        return {
            "cluster/env_episodes": s.get("episodes", 0.0),
            "cluster/env_calls": calls,
            "cluster/env_call_seconds_mean": s.get("seconds", 0.0) / calls if calls else 0.0,
            "cluster/env_nodes": float(nodes),
            "cluster/env_worker_restarts": s.get("restarts", 0.0),
            "cluster/env_reissued": s.get("reissued", 0.0),
            "cluster/env_workers_alive": float(alive),
        }

    def close(self) -> None:
        for s in self.slots:
            try:
                self.ray.kill(s.handle, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self.slots = []
        self.session.close()


class RemoteEpisode:
    """The driver's side of one episode: tools with the task's names and schemas that forward to the worker the
    episode was opened on (opened at its first call, so an episode that calls nothing costs one open at finish)."""

    def __init__(self, workers: EnvWorkers, row: dict[str, Any]):
        self.w, self.row = workers, row
        self.eid = uuid.uuid4().hex
        self.slot: Slot | None = None
        self.handle: Any = None
        self.tools = [dataclasses.replace(t, func=self._forwarder(t.name)) for t in workers.template.values()]

    async def _open(self) -> Slot:
        """The slot the episode is open on, opening it first if it is not yet."""
        if self.slot is None:
            slot = self.w.pick()
            handle = slot.handle
            try:
                node = await self.w.request(slot, handle, "open", self.eid, self.row, timeout=self.w.cc.actor_timeout_s)
            except BaseException:
                self.w.done(slot, handle)
                raise
            self.slot, self.handle = slot, handle
            self.w.opened_on(node)
        return self.slot

    def _forwarder(self, name: str) -> Any:
        async def forward(**args: Any) -> Any:
            slot = await self._open()
            # No timeout here: call_tool bounds this call by the task's tool_timeout_s, as for a local tool.
            return await self.w.request(slot, self.handle, "call", self.eid, name, args, timeout=None)

        forward.__name__ = name
        return forward

    async def finish(self, final_call: dict[str, Any] | None) -> Any:
        slot = await self._open()
        try:
            return await self.w.request(
                slot, self.handle, "finish", self.eid, final_call, timeout=self.w.cc.actor_timeout_s
            )
        finally:
            self.w.done(slot, self.handle)

    async def discard(self) -> None:
        """The rollout raised before `finish` (one sample failed, envs/isolate.py, and the run goes on): drop the
        episode on its worker and give its slot back, or each failed sample would leave one open there for good."""
        if self.slot is None:
            return
        slot, handle, self.slot = self.slot, self.handle, None
        try:
            await self.w.request(slot, handle, "discard", self.eid, timeout=self.w.cc.actor_timeout_s)
        finally:
            self.w.done(slot, handle)


class ReissueOnLoss:
    """An Env whose rollouts run again from the start when their env worker is lost (EnvWorkerLost), at most
    cluster.max_restarts times per rollout. Everything else is the wrapped env's."""

    def __init__(self, env: Any, workers: EnvWorkers):
        self.env, self.workers = env, workers

    async def rollout(self, row: dict[str, Any], sampler: Sampler, params: SampleParams | None = None) -> Trajectory:
        for _ in range(self.workers.cc.max_restarts + 1):
            try:
                return await self.env.rollout(row, sampler, params)
            except EnvWorkerPoolError:
                raise
            except EnvWorkerLost as e:
                last = e
                self.workers.count_reissue()
        raise EnvWorkerPoolError(
            f"a rollout lost its env worker {self.workers.cc.max_restarts + 1} times (last: {last})"
        )

    async def score(self, trajectories: list[Trajectory]) -> list[Score]:
        return await self.env.score(trajectories)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)


def remote_env(task: Any, workers: EnvWorkers, tokenizer: Any, params: SampleParams) -> Any:
    """The env the task would run in, with every episode opened on the workers and re-issued on loss."""
    from posttrain.envs.base import make_env

    return ReissueOnLoss(make_env(dataclasses.replace(task, episode=workers.episode), tokenizer, params), workers)
