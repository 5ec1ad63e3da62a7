"""Sandboxed runs and grading on Ray (`cluster.sandbox=ray`): every SandboxPool's runs become Ray tasks.

    with RayGrading.start(cfg.cluster) as g:      connect (or start) Ray; install the executor for the block
        ...                                       pools call g.call(fn, *args) through sandbox/pool.py
        g.drain_metrics()                         cluster/grade_* counters since the last drain

Why tasks and not actors: a sandboxed run is stateless (files in, result out), so a Ray task per run with
`cluster.grader_num_cpus` reserved and the SPREAD strategy fans a step's runs over the nodes, and a node that
dies takes only its running tasks, which Ray runs again elsewhere (`cluster.grade_retries`). The grader stays
outside the sandbox, as in process: the remote function is the same `grade_function` / `grade_pytest` /
`run_command` the thread executor calls, so a node grades exactly as the driver would.

Failure: a run that does not come back within `cluster.grade_timeout_s` is cancelled and raises TimeoutError; a
worker that died past its retries raises Ray's error. SandboxPool turns either into a failed sample (score 0,
the error kept), never a stopped step. A grader's own exception comes back as itself (Ray's wrapper removed), so
`SandboxUnavailable` still stops the run as it does locally.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from posttrain.cluster.ray_runtime import RaySession
from posttrain.config.schema import ClusterConfig
from posttrain.sandbox.pool import use_executor

T = TypeVar("T")


def _run_here(fn: Callable[..., T], args: tuple) -> tuple[T, str]:
    """The Ray task body: the call, and the node it ran on (for the spread metric)."""
    import ray

    return fn(*args), ray.get_runtime_context().get_node_id()


class RayGrading:
    def __init__(self, cc: ClusterConfig, session: RaySession):
        self.cc, self.session, self.ray = cc, session, session.ray
        self._remote = self.ray.remote(_run_here).options(
            num_cpus=cc.grader_num_cpus,
            max_retries=cc.grade_retries,
            retry_exceptions=False,
            scheduling_strategy="SPREAD",
        )
        self._lock = threading.Lock()
        self._nodes: collections.Counter[str] = collections.Counter()
        self._stats = {"calls": 0, "timeouts": 0, "errors": 0, "seconds": 0.0}
        self._cm: Any = None

    @classmethod
    def start(cls, cc: ClusterConfig) -> RayGrading:
        # A private local Ray is sized by ray_runtime.cpus_needed (two runs at once, a SandboxPool's default
        # concurrency); a cluster joined by address brings its own CPUs.
        return cls(cc, RaySession.connect(cc))

    def __enter__(self) -> RayGrading:
        self._cm = use_executor(self)
        self._cm.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    async def call(self, fn: Callable[..., T], *args: Any, cancel: threading.Event | None = None) -> T:
        """`cancel` cannot cross to the node; a cancelled caller cancels the Ray task instead (force: the worker
        process dies, and its sandbox with it: bwrap --die-with-parent, unshare's parent-death signal)."""
        t0 = time.perf_counter()
        ref = self._remote.remote(fn, args)
        try:
            result, node = await asyncio.wait_for(asyncio.wrap_future(ref.future()), self.cc.grade_timeout_s)
        except asyncio.CancelledError:
            self.ray.cancel(ref, force=True)
            raise
        except TimeoutError:
            self.ray.cancel(ref, force=True)
            self._count(timeouts=1, seconds=time.perf_counter() - t0)
            raise TimeoutError(
                f"a sandboxed run on Ray did not return within cluster.grade_timeout_s={self.cc.grade_timeout_s:g}s"
            ) from None
        except self.ray.exceptions.RayTaskError as e:
            self._count(errors=1, seconds=time.perf_counter() - t0)
            cause = getattr(e, "cause", None)
            raise (cause if isinstance(cause, Exception) else e) from None  # the grader's own error, as locally
        except Exception:
            self._count(errors=1, seconds=time.perf_counter() - t0)
            raise
        self._count(seconds=time.perf_counter() - t0, node=node)
        return result

    def _count(self, timeouts: int = 0, errors: int = 0, seconds: float = 0.0, node: str | None = None) -> None:
        with self._lock:
            self._stats["calls"] += 1
            self._stats["timeouts"] += timeouts
            self._stats["errors"] += errors
            self._stats["seconds"] += seconds
            if node is not None:
                self._nodes[node] += 1

    def drain_metrics(self) -> dict[str, float]:
        """Counters since the last drain: runs sent, timed out, failed in Ray, their mean round-trip seconds and
        how many distinct nodes ran them."""
        with self._lock:
            s, nodes = dict(self._stats), len(self._nodes)
            self._stats = {"calls": 0, "timeouts": 0, "errors": 0, "seconds": 0.0}
            self._nodes.clear()
        if not s["calls"]:
            return {}
        return {
            "cluster/grade_calls": float(s["calls"]),
            "cluster/grade_timeouts": float(s["timeouts"]),
            "cluster/grade_errors": float(s["errors"]),
            "cluster/grade_seconds_mean": s["seconds"] / s["calls"],
            "cluster/grade_nodes": float(nodes),
        }

    def close(self) -> None:
        if self._cm is not None:
            cm, self._cm = self._cm, None
            cm.__exit__(None, None, None)
        self.session.close()


def start_grading(cc: ClusterConfig) -> RayGrading | None:
    """The run's grading executor, installed: a RayGrading when cluster.sandbox=ray, else None (Ray never
    imported). The caller closes it when the run ends."""
    if cc.sandbox != "ray":
        return None
    return RayGrading.start(cc).__enter__()
