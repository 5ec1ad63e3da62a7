"""Ray itself: importing it, joining or starting a cluster, and placement groups for the sampler actors.

Ray is an optional dependency (`pip install 'posttrain[ray]'`), so it is imported here, inside functions, and
only when `cluster.backend=ray` asks for it.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

from posttrain.config.schema import ClusterConfig
from posttrain.errors import PosttrainError

INSTALL_HINT = "cluster.backend=ray needs Ray: pip install 'posttrain[ray]' (or set cluster.backend=local)"

# Our placement names to Ray's strategies. SPREAD is soft: with fewer nodes than actors it still places them all.
STRATEGIES = {"spread": "SPREAD", "pack": "PACK"}


class RayUnavailable(PosttrainError, ImportError):
    """Ray is not installed in this environment."""


def import_ray() -> Any:
    try:
        import ray
    except ImportError as e:
        raise RayUnavailable(f"{INSTALL_HINT} ({e})") from None
    return ray


@dataclass
class RaySession:
    """This run's link to Ray. `owned`: this process called ray.init, so closing the run shuts it down (a private
    cluster with `address=local`, the driver's connection otherwise); a Ray the caller had already started stays."""

    ray: Any
    owned: bool

    @classmethod
    def connect(cls, cc: ClusterConfig) -> RaySession:
        ray = import_ray()
        if ray.is_initialized():
            return cls(ray, owned=False)
        if cc.address == "local":
            # A private Ray sized for everything the config puts on it (logical CPUs, not cores): whichever part
            # of the run connects first starts it, so it must have room for the parts that connect after.
            ray.init(
                num_cpus=max(1, math.ceil(cpus_needed(cc))), include_dashboard=False, logging_level=logging.WARNING
            )
        else:
            try:
                ray.init(address=cc.address, logging_level=logging.WARNING)
            except ConnectionError as e:
                raise ConnectionError(
                    f"cluster.address={cc.address}: no Ray cluster to join ({e}); start one "
                    "(ray start --head) or use cluster.address=local"
                ) from None
        return cls(ray, owned=True)

    def close(self) -> None:
        if self.owned and self.ray.is_initialized():
            self.ray.shutdown()


def cpus_needed(cc: ClusterConfig) -> float:
    """Logical CPUs this config reserves on Ray: sampler actors, two sandboxed runs at once (a SandboxPool's
    default concurrency), env workers; the parts not on Ray count 0."""
    samplers = cc.num_samplers * cc.sampler_resources.num_cpus if cc.backend == "ray" else 0.0
    graders = cc.grader_num_cpus * 2 if cc.sandbox == "ray" else 0.0
    envs = cc.num_env_workers * cc.env_worker_num_cpus if cc.envs == "ray" else 0.0
    return samplers + graders + envs


def placement_group(ray: Any, cc: ClusterConfig) -> Any:
    """One bundle per sampler actor (its CPUs and GPUs), placed by `cluster.placement`; waits until reserved."""
    from ray.util.placement_group import placement_group as make_pg

    res = cc.sampler_resources
    bundle = {"CPU": res.num_cpus, **({"GPU": res.num_gpus} if res.num_gpus else {})}
    pg = make_pg([dict(bundle) for _ in range(cc.num_samplers)], strategy=STRATEGIES[cc.placement])
    ready, _ = ray.wait([pg.ready()], timeout=cc.actor_timeout_s)
    if not ready:
        ray.util.remove_placement_group(pg)
        raise TimeoutError(
            f"the cluster could not reserve {cc.num_samplers} x {bundle} for the sampler actors in "
            f"{cc.actor_timeout_s:g}s (cluster resources: {ray.cluster_resources()}); lower "
            "cluster.num_samplers or cluster.sampler_resources"
        )
    return pg
