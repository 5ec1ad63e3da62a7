"""Ray sampler actors fed by MemoryWeights (cluster/ray_weights.py): from the trainer's shared-memory block on its
own node, by a gloo broadcast on another node, through an actor killed before a push, and for a whole run.

The actors are pinned to one node of the shared two-node cluster (tests/cluster/conftest.py) by filling the other
node's one CPU with a placeholder actor and giving each sampler half a CPU: the placement group then fits on that
node only. The driver is attached to the head, so "the trainer's node" is the head."""

from __future__ import annotations

import asyncio
import sys
import time
from contextlib import contextmanager

import pytest
import torch

ray = pytest.importorskip("ray")

from posttrain.cluster.ray_sampler import RaySamplerPool, SamplerPoolError  # noqa: E402
from posttrain.cluster.ray_weights import MemoryWeights, ObjectStoreWeights, ray_weight_sync  # noqa: E402
from posttrain.config import load_config  # noqa: E402
from posttrain.loop import train  # noqa: E402
from posttrain.obs import read_metrics  # noqa: E402
from posttrain.types import SampleParams  # noqa: E402

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the placeholder's class travels by value

FAST = ["model.name=tiny-random", "model.threads=1", "task.name=count-a", "logging.tensorboard=false",
        "logging.console=false", "loop.eval_prompts=8", "loop.save_every=0", "diagnostics.remedies.enabled=false"]
# Two half-CPU actors packed on one node; the timeout covers an actor start on a loaded 2-core box.
RAY = ["cluster.backend=ray", "cluster.address=auto", "cluster.num_samplers=2", "cluster.placement=pack",
       "cluster.sampler_resources.num_cpus=0.5", "cluster.actor_timeout_s=120"]
GREEDY = SampleParams(max_tokens=8, temperature=0.0)


def _cfg(tmp_path, *extra):
    return load_config(None, FAST + RAY + [f"run.output_dir={tmp_path}"] + list(extra))


class Placeholder:
    def node(self) -> str:
        return ray.get_runtime_context().get_node_id()


def _nodes() -> tuple[str, str]:
    """(the driver's node: the head, the other one)."""
    head = ray.get_runtime_context().get_node_id()
    (other,) = [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeID"] != head]
    return head, other


@contextmanager
def _actors_on(node: str):
    """Sampler actors started inside land on `node`: the other node's CPU is held by a placeholder."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    head, other = _nodes()
    full = other if node == head else head
    hold = ray.remote(Placeholder).options(
        num_cpus=1, scheduling_strategy=NodeAffinitySchedulingStrategy(full, soft=False)).remote()
    assert ray.get(hold.node.remote(), timeout=120) == full
    try:
        yield
    finally:
        ray.kill(hold)


def _trainer_model(cfg):
    """The trainer's model, built as every actor builds its own (same seed, same routing of the linears)."""
    from posttrain.models.policy import load_base_model, with_lora

    model, tok = load_base_model(cfg, log=lambda *_: None)
    return with_lora(cfg, model).eval(), tok


def _prompts(tok):
    return [tok(f"say a {i}")["input_ids"] for i in range(3)]


def _local(cfg, model, tok):
    """Greedy completions of the trainer's model, in this process."""
    from posttrain.models.load import stop_token_ids
    from posttrain.sampling.context import run_budget
    from posttrain.sampling.hf_sampler import HFSampler

    sampler = HFSampler(model, tok, stop_token_ids(model, tok), seed=0, context=run_budget(cfg, model))
    return [c for (c,) in sampler.sample_sync(_prompts(tok), GREEDY, n=1)]


def _remote(slot, tok):
    return ray.get(slot.handle.sample_rows.remote(_prompts(tok), GREEDY), timeout=120)


def _assert_serves(pool, tok, want, version):
    """Every live actor answers greedily as the trainer's model does, stamped with `version`."""
    for slot in pool.live_slots():
        got = _remote(slot, tok)
        assert [c.token_ids for c in got] == [c.token_ids for c in want], slot.rank
        assert {c.policy_version for c in got} == {version}
        for g, w in zip(got, want):
            torch.testing.assert_close(torch.tensor(g.logprobs), torch.tensor(w.logprobs), atol=1e-4, rtol=0)


@torch.no_grad()
def _perturb(model, seed: int) -> dict[str, torch.Tensor]:
    """Noise on every weight (enough to change greedy tokens); returns the weights as they were."""
    g = torch.Generator().manual_seed(seed)
    old = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.add_(torch.randn(p.shape, generator=g) * 0.5)
    return old


@torch.no_grad()
def _restore(model, old):
    for n, p in model.named_parameters():
        p.copy_(old[n])


def test_actors_on_the_trainers_node_load_from_shared_memory(tmp_path, two_nodes):
    head, _ = _nodes()
    cfg = _cfg(tmp_path)
    model, tok = _trainer_model(cfg)
    with _actors_on(head):
        pool = RaySamplerPool.start(cfg, tok)
    sync = ray_weight_sync(cfg, model, pool)  # weight_transport=auto
    try:
        assert isinstance(sync, MemoryWeights) and {s.node_id for s in pool.slots} == {head}
        original = _local(cfg, model, tok)
        _assert_serves(pool, tok, original, -1)  # same weights before any push

        old = _perturb(model, seed=1)
        m = sync.push(1)
        assert m["cluster/weight_shared_actors"] == 2 and m["cluster/weight_group_actors"] == 0
        assert m["cluster/weight_group_rebuilds"] == 0 and m["cluster/weight_mb"] > 0
        perturbed = _local(cfg, model, tok)
        assert [c.token_ids for c in perturbed] != [c.token_ids for c in original]  # the push changed something
        _assert_serves(pool, tok, perturbed, 1)

        _restore(model, old)
        sync.push(2)
        _assert_serves(pool, tok, original, 2)  # the old weights back: the original tokens exactly
    finally:
        sync.close()


def test_actors_on_another_node_load_by_the_group(tmp_path, two_nodes):
    _, worker = _nodes()
    cfg = _cfg(tmp_path, "cluster.weight_bucket_mb=0.05")  # several buckets even for the tiny model
    model, tok = _trainer_model(cfg)
    with _actors_on(worker):
        pool = RaySamplerPool.start(cfg, tok)
    sync = ray_weight_sync(cfg, model, pool)
    try:
        assert {s.node_id for s in pool.slots} == {worker}
        _perturb(model, seed=2)
        m = sync.push(1)
        assert len(sync.buckets) > 1
        assert m["cluster/weight_group_actors"] == 2 and m["cluster/weight_shared_actors"] == 0
        _assert_serves(pool, tok, _local(cfg, model, tok), 1)

        before = _perturb(model, seed=3)
        m = sync.push(2)
        assert m["cluster/weight_group_rebuilds"] == 1  # the same actors: the group was kept
        v2 = _local(cfg, model, tok)
        _assert_serves(pool, tok, v2, 2)

        # Actor 1 falls back to version 1 (through the object-store method): the pool catches the stale
        # completions, the actor reloads version 2 through a group of its own and samples its share again.
        ray.get(pool.slots[1].handle.load_weights.remote(before, 1), timeout=120)
        out = asyncio.run(pool.sample(_prompts(tok), GREEDY))
        assert [c.token_ids for (c,) in out] == [c.token_ids for c in v2]
        assert {c.policy_version for (c,) in out} == {2}
        assert sync.groups.kept is None  # actor 1 left the cached group for its own: it is rebuilt at the next push

        _perturb(model, seed=5)
        m = sync.push(3)
        assert m["cluster/weight_group_rebuilds"] == 3 and m["cluster/actor_restarts"] == 0
        _assert_serves(pool, tok, _local(cfg, model, tok), 3)
    finally:
        sync.close()


@pytest.mark.parametrize("buckets", [
    # One bucket: the survivor has its copy before the trainer's send reaches the dead member.
    ["cluster.actor_timeout_s=120"],
    # Many: the survivor is left waiting for its next bucket until the group's timeout, then loads again in a
    # rebuilt group. It costs that timeout, hence a short one and the slow mark.
    pytest.param(["cluster.weight_bucket_mb=0.05", "cluster.actor_timeout_s=45"], marks=pytest.mark.slow),
], ids=["one_bucket", "many_buckets"])
def test_an_actor_killed_before_a_group_push_is_replaced_and_serves_the_push(tmp_path, two_nodes, buckets):
    _, worker = _nodes()
    cfg = _cfg(tmp_path, "cluster.weight_transport=group", "cluster.max_restarts=1", *buckets)
    model, tok = _trainer_model(cfg)
    with _actors_on(worker):
        pool = RaySamplerPool.start(cfg, tok)
    sync = ray_weight_sync(cfg, model, pool)
    try:
        sync.push(1)  # the group is built and cached
        killed = pool.slots[0].handle
        ray.kill(killed)  # asynchronous: wait until it is gone, or it may still take the push and die after
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(killed.ready.remote(), timeout=60)
        _perturb(model, seed=4)
        t0 = time.monotonic()
        m = sync.push(2)
        took = time.monotonic() - t0
        # Bounded: the dead member fails the send at once; at worst the survivor waits out one group timeout,
        # and the replacement starts within another.
        assert took < 3 * cfg.cluster.actor_timeout_s, took
        assert m["cluster/actor_restarts"] == 1 and m["cluster/samplers_alive"] == 2
        assert m["cluster/weight_group_actors"] == 2
        assert pool.slots[0].handle is not killed and pool.slots[0].incarnation == 1
        assert pool.slots[0].node_id == worker  # the replacement is in the same bundle
        _assert_serves(pool, tok, _local(cfg, model, tok), 2)
    finally:
        sync.close()


def test_object_store_stays_the_fallback(tmp_path, two_nodes):
    """weight_transport=object_store keeps the old path; the memory transports refuse what they cannot do."""
    head, worker = _nodes()
    cfg = _cfg(tmp_path, "cluster.weight_transport=object_store", "cluster.num_samplers=1")
    model, tok = _trainer_model(cfg)
    with _actors_on(worker):
        pool = RaySamplerPool.start(cfg, tok)
    try:
        assert isinstance(ray_weight_sync(cfg, model, pool), ObjectStoreWeights)
        with pytest.raises(SamplerPoolError, match="shared_memory: sampler actor 0 is on node"):
            MemoryWeights(model, pool, transport="shared_memory")
        with pytest.raises(ValueError, match="transport must be one of"):
            MemoryWeights(model, pool, transport="file")
    finally:
        pool.close()


def test_a_run_with_actors_on_another_node_trains_on_group_pushes(tmp_path, two_nodes, pools):
    _, worker = _nodes()
    with _actors_on(worker):
        res = train(_cfg(tmp_path, "loop.steps=3", "loop.prompts_per_step=2", "algorithm.num_generations=2",
                         "loop.eval_before=false", "loop.eval_prompts=2"))
    (pool,) = pools
    assert {s.node_id for s in pool.slots} == {worker}
    recs = [r for r in read_metrics(str(res.run_dir)) if r["kind"] == "train"]
    assert [r["step"] for r in recs] == [1, 2, 3]
    assert all(r["cluster/weight_group_actors"] == 2 and r["cluster/weight_shared_actors"] == 0 for r in recs)
    assert all(r["cluster/actor_restarts"] == 0 for r in recs)
    assert recs[-1]["cluster/weight_group_rebuilds"] == 1  # one group for the whole run
