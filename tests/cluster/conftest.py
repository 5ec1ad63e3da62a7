"""A two-node Ray cluster on this machine, shared by the cluster tests (starting one costs seconds)."""

import pytest


@pytest.fixture(scope="package")
def two_nodes():
    """A head and one simulated worker node, one CPU each: two one-CPU actors or tasks can only fit one per node."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    small = {"num_cpus": 1, "object_store_memory": 100 * 1024 ** 2}
    cluster = Cluster(initialize_head=True, head_node_args={**small, "include_dashboard": False})
    cluster.add_node(**small)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, logging_level="WARNING")
    yield ray
    ray.shutdown()
    cluster.shutdown()


@pytest.fixture
def pools(monkeypatch):
    """Every RaySamplerPool a run starts, kept for the test to look at (and to kill its actors)."""
    from posttrain.cluster.ray_sampler import RaySamplerPool

    started: list = []
    start = RaySamplerPool.start

    def keep(cls, *args):
        started.append(start(*args))
        return started[-1]

    monkeypatch.setattr(RaySamplerPool, "start", classmethod(keep))
    return started
