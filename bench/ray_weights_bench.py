"""The Ray part of bench/weight_sync.py (`--parts ray`): pushes into 2 Ray sampler actors (the own sampler) on a
private local Ray, by transport, full weights and a LoRA adapter.

First `auto` on a 2-node local cluster with both actors on the worker node (so through the group, as on a real
second machine; here the same host's sockets). Then, for each of object store (ObjectStoreWeights), shared memory and group (MemoryWeights with the transport forced:
here every actor is on the trainer's node, so `auto` would pick shared memory; forcing the group measures the
broadcast path that actors on other nodes take), a pool of 2 actors is fed `repeats` pushes of nudged weights,
each timed from the call to the pool's return (every actor loaded and confirmed the version). The first push of
each transport lays out the flat copy or opens the group and is not timed.
"""

from __future__ import annotations

import statistics
import time

import torch
from _weights_common import row  # the row format bench/weight_sync.py prints too


def _cfg(model_name: str, lora_r: int, transport: str, address: str = "local"):
    from posttrain.config import load_config

    over = [f"model.name={model_name}", "model.threads=1", "task.name=count-a", "cluster.backend=ray",
            f"cluster.address={address}", "cluster.num_samplers=2", "cluster.sampler_resources.num_cpus=1",
            "cluster.placement=pack", "cluster.actor_timeout_s=600", f"cluster.weight_transport={transport}",
            "logging.console=false", "logging.tensorboard=false"]
    if lora_r:
        over += ["lora.enabled=true", f"lora.r={lora_r}", f"lora.alpha={2 * lora_r}"]
    return load_config(None, over)


def _one(model_name: str, lora_r: int, transport: str, repeats: int,
         address: str = "local") -> tuple[list[float], float]:
    from posttrain.cluster.ray_sampler import RaySamplerPool
    from posttrain.cluster.ray_weights import ray_weight_sync
    from posttrain.models.policy import load_base_model, with_lora
    from posttrain.sampling.weight_ipc import trainable_state

    cfg = _cfg(model_name, lora_r, transport, address)
    model, tok = load_base_model(cfg, log=lambda *_: None)
    model = with_lora(cfg, model)
    pool = RaySamplerPool.start(cfg, tok)
    try:
        sync = ray_weight_sync(cfg, model, pool)
        times = []
        for v in range(repeats + 1):
            with torch.no_grad():
                for p in trainable_state(model).values():
                    p.add_(1e-3)
            t0 = time.perf_counter()
            m = sync.push(v)
            times.append(time.perf_counter() - t0)
        if transport == "auto" and address == "auto":  # the 2-node case: the group, not shared memory, carried it
            assert m.get("cluster/weight_group_actors") == 2.0, m
        mb = sum(t.numel() * t.element_size() for t in trainable_state(model).values()) / 1e6
        return times[1:], mb
    finally:
        pool.close()


def _two_nodes(model_name: str, repeats: int) -> tuple[list[float], float]:
    """`auto` on a 2-node local cluster (ray.cluster_utils.Cluster) whose head has no CPU for actors: both actors
    land on the worker node, so every push goes through the group."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, logging_level="WARNING")
    try:
        return _one(model_name, 0, "auto", repeats, address="auto")
    finally:
        ray.shutdown()
        cluster.shutdown()


def bench_ray_actors(model_name: str, lora_r: int, repeats: int) -> list[dict]:
    times, mb = _two_nodes(model_name, repeats)
    rows = [row("group (auto, actors on the worker node of a 2-node local cluster)", "Ray actor x2 (own sampler)",
                "float32", mb, times)]
    for r in (0, lora_r):
        for transport, label in (("object_store", "object store"), ("shared_memory", "shared memory"),
                                 ("group", "group (gloo)")):
            times, mb = _one(model_name, r, transport, repeats)
            name = label if not r else f"LoRA r={r}, {label}"
            rows.append(row(name, "Ray actor x2 (own sampler)", "float32", mb, times))
            print(f"  median of {len(times)}: {statistics.median(times):.4f} s", flush=True)
    return rows
