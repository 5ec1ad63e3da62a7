"""Weight sync from a trainer process to the engines that sample, by transport: median seconds of 5 pushes.

    python bench/weight_sync.py [--model default] [--repeats 5] [--lora-r 16] [--parts own vllm ray]
                                [--dtypes float32 bfloat16]

For each transport the trainer changes its weights, pushes them, and the time is taken until the sampler process
holds them (it confirms over a queue; the confirmation's own latency, about a millisecond, is included):

- in-process copy (CopyWeights, the async loop today): into a second model in the same process
- shared memory (SharedMemoryWeights): one copy into a block the sampler process's parameters are views of
- torch.distributed broadcast over gloo (BroadcastWeights -> BroadcastReceiver)
- file (FileWeights, safetensors + rename) and the sampler's read of it
- LoRA adapter-only: shared memory with only the adapter tensors (rank --lora-r on all linear layers)

`--parts vllm` adds pushes into real vLLM servers (cluster/vllm_servers.py, posttrain-started, the CPU build here),
1 and 2 of them, per engine dtype, through each of the pool's transports (cluster/server_loads.py): file
(safetensors written, each server reloads it), shared memory (one cast copy every server loads in place) and group
(the same copy broadcast over a gloo group the servers joined). A server push is timed from the call to the pool's
return: pause, load, prefix-cache reset, version label and check, resume, on every server. Servers are pushed
merged full weights under LoRA (so a LoRA run costs what a full one does there, plus the merge).

`--parts ray` adds pushes into 2 Ray sampler actors (the own sampler, cluster/ray_sampler.py) on a local Ray:
object store, shared memory and the group (cluster/ray_weights.py), full and LoRA.

Prints a table, writes bench/results/weight_sync.{json,md} (rows of the parts not run are kept from the last run).
Goals: shared memory <= 0.3 s for the default model's ~538 MB of fp32 weights into a process; a push to 2 vLLM
engines under 0.5 s; LoRA adapter-only under 0.1 s.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import multiprocessing as mp
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ray_weights_bench.py (the ray part)

from posttrain.sampling.weight_ipc import (BroadcastReceiver, BroadcastWeights, FileWeights, SharedMemoryWeights,
                                       SharedWeightsReceiver, read_file_weights, trainable_state)
from posttrain.loop.weight_sync import CopyWeights
from _weights_common import row  # the table row both weight benches print

RESULTS = Path(__file__).resolve().parent / "results"


def load(model_name: str, lora_r: int):
    from posttrain.models import load_model
    from posttrain.models.lora import apply_lora

    model, _ = load_model(model_name, log=lambda s: None)
    if lora_r:
        model = apply_lora(model, r=lora_r, alpha=2.0 * lora_r, dropout=0.0,
                           target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    return model


def nudge(model) -> None:
    with torch.no_grad():
        for p in trainable_state(model).values():
            p.add_(1e-3)


# ---- sampler processes ------------------------------------------------------------------------------------
def shm_sampler(model_name, lora_r, name, specs, lock, req, rep):
    torch.set_num_threads(1)
    model = load(model_name, lora_r)
    recv = SharedWeightsReceiver(name, specs, lock)
    recv.bind(model)
    rep.put("ready")
    while (want := req.get(timeout=600)) is not None:
        while True:  # the weights are in place once the version is there: nothing to copy on this side
            with recv.guard() as v:
                if v >= want:
                    break
            time.sleep(1e-4)
        rep.put(v)
    recv.close()


def broadcast_sampler(model_name, port, rep, repeats):
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=1, world_size=2, timeout=datetime.timedelta(seconds=600))
    recv = BroadcastReceiver(load(model_name, 0))
    rep.put("ready")
    for _ in range(repeats):
        rep.put(recv.pull())
    dist.destroy_process_group()


def file_sampler(model_name, directory, req, rep):
    torch.set_num_threads(1)
    model = load(model_name, 0)
    rep.put("ready")
    while (want := req.get(timeout=600)) is not None:
        rep.put(read_file_weights(directory, model))


# ---- the trainer side -------------------------------------------------------------------------------------
def notifying(sync, req):
    """A push that also tells the sampler process which version to wait for."""
    def push(v):
        sync.push(v)
        req.put(v)
    return push


def timed_pushes(model, push, confirm, repeats: int) -> list[float]:
    """Change the weights (untimed), then time push + the sampler's confirmation."""
    out = []
    for v in range(1, repeats + 1):
        nudge(model)
        t0 = time.perf_counter()
        push(v)
        got = confirm(v)
        out.append(time.perf_counter() - t0)
        assert got == v, (got, v)
    return out


def bench_copy(model, repeats):
    sampler_model = copy.deepcopy(model)

    class Recv:  # CopyWeights' sampler side: HFSampler.load_weights without the decode lock
        policy_version = 0

        def load_weights(self, state, version):
            params = dict(sampler_model.named_parameters())
            with torch.no_grad():
                for n, t in state.items():
                    params[n].copy_(t)
            self.policy_version = version

    recv = Recv()
    sync = CopyWeights(model, recv)
    return timed_pushes(model, sync.push, lambda v: recv.policy_version, repeats)


def bench_shm(model, model_name, lora_r, repeats):
    ctx = mp.get_context("spawn")
    lock, req, rep = ctx.Lock(), ctx.Queue(), ctx.Queue()
    sync = SharedMemoryWeights(model, lock)
    proc = ctx.Process(target=shm_sampler, args=(model_name, lora_r, *sync.receiver_args(), lock, req, rep))
    proc.start()
    assert rep.get(timeout=600) == "ready"

    try:
        return timed_pushes(model, notifying(sync, req), lambda v: rep.get(timeout=600), repeats)
    finally:
        req.put(None)
        proc.join(timeout=120)
        sync.close()


def bench_broadcast(model, model_name, repeats):
    import torch.distributed as dist

    ctx = mp.get_context("spawn")
    rep = ctx.Queue()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = ctx.Process(target=broadcast_sampler, args=(model_name, port, rep, repeats))
    proc.start()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=0, world_size=2, timeout=datetime.timedelta(seconds=600))
    assert rep.get(timeout=600) == "ready"
    sync = BroadcastWeights(model)
    try:
        return timed_pushes(model, sync.push, lambda v: rep.get(timeout=600), repeats)
    finally:
        proc.join(timeout=120)
        dist.destroy_process_group()


def bench_file(model, model_name, repeats):
    ctx = mp.get_context("spawn")
    req, rep = ctx.Queue(), ctx.Queue()
    with tempfile.TemporaryDirectory() as d:
        sync = FileWeights(model, d)
        proc = ctx.Process(target=file_sampler, args=(model_name, d, req, rep))
        proc.start()
        assert rep.get(timeout=600) == "ready"

        try:
            return timed_pushes(model, notifying(sync, req), lambda v: rep.get(timeout=600), repeats)
        finally:
            req.put(None)
            proc.join(timeout=120)


# ---- vLLM servers ------------------------------------------------------------------------------------------
def bench_vllm_servers(model, tokenizer, dtype: str, repeats: int, work: Path) -> list[dict]:
    """One pool of 2 servers per dtype; the 1-server rows set server 1 aside (the `retired` flag the pool's live
    list reads; not killed) so both counts use the same processes."""
    from posttrain.cluster.server_loads import LOADS
    from posttrain.cluster.vllm_servers import VLLMServerPool
    from posttrain.sampling.vllm_engine import EngineSpec
    from posttrain.sampling.vllm_weights import hf_state, write_model_folder

    folder = write_model_folder(model, tokenizer, work / f"model-{dtype}")
    spec = EngineSpec(model_dir=str(folder), dtype=dtype, max_model_len=512, kv_cache_gb=0.25)
    pool = VLLMServerPool.start(spec, tokenizer, [tokenizer.eos_token_id], num_servers=2, work_dir=work / dtype,
                                timeout_s=300, start_timeout_s=600, env={"OMP_NUM_THREADS": "1"},
                                log=lambda s: print("  " + s, flush=True))
    rows, version = [], 0
    try:
        for kind in ("file", "shared_memory", "group"):
            own, pool.loads = pool.loads, LOADS[kind](pool)
            for n in (1, 2):
                pool.slots[1].retired = n == 1
                times = []
                for _ in range(repeats + 1):  # the first push lays out the flat copy / opens the group: untimed
                    nudge(model)
                    version += 1
                    t0 = time.perf_counter()
                    pool.push(hf_state(model), version)
                    times.append(time.perf_counter() - t0)
                pool.slots[1].retired = False
                mb = sum(s.nbytes for s in pool.loads.flat.specs) / 1e6 if getattr(pool.loads, "flat", None) else (
                    (pool.weights_dir / "model.safetensors").stat().st_size / 1e6)
                rows.append(row(f"{pool.loads.kind}", f"vLLM server x{n}", dtype, mb, times[1:]))
            pool.loads.close()
            pool.loads = own
    finally:
        pool.close()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="default")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--lora-r", type=int, default=16)
    ap.add_argument("--parts", nargs="+", choices=["own", "vllm", "ray"], default=["own", "vllm", "ray"])
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], help="engine dtypes (vllm part)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = load(args.model, 0)
    mb = sum(t.numel() * t.element_size() for t in trainable_state(model).values()) / 1e6
    lora = load(args.model, args.lora_r)
    lora_mb = sum(t.numel() * t.element_size() for t in trainable_state(lora).values()) / 1e6
    old = json.loads((RESULTS / "weight_sync.json").read_text()) if (RESULTS / "weight_sync.json").exists() else {}
    rows = [r for r in old.get("rows", []) if r.get("part", "own") not in args.parts]
    if "own" in args.parts:
        for name, size, fn in [
            ("in-process copy", mb, lambda: bench_copy(model, args.repeats)),
            ("shared memory", mb, lambda: bench_shm(model, args.model, 0, args.repeats)),
            ("broadcast (gloo)", mb, lambda: bench_broadcast(model, args.model, args.repeats)),
            ("file (safetensors)", mb, lambda: bench_file(model, args.model, args.repeats)),
            (f"LoRA r={args.lora_r}, shared memory", lora_mb, lambda: bench_shm(lora, args.model, args.lora_r,
                                                                                 args.repeats)),
            (f"LoRA r={args.lora_r}, in-process copy", lora_mb, lambda: bench_copy(lora, args.repeats)),
        ]:
            rows.append({**row(name, "own sampler process", "float32", size, fn()), "part": "own"})
    if "vllm" in args.parts:
        from posttrain.models import load_model

        _, tok = load_model(args.model, log=lambda s: None)
        with tempfile.TemporaryDirectory() as d:
            for dtype in args.dtypes:
                rows += [{**r, "part": "vllm"} for r in bench_vllm_servers(model, tok, dtype, args.repeats, Path(d))]
    if "ray" in args.parts:
        from ray_weights_bench import bench_ray_actors

        rows += [{**r, "part": "ray"} for r in bench_ray_actors(args.model, args.lora_r, args.repeats)]
    order = {"own": 0, "vllm": 1, "ray": 2}
    rows.sort(key=lambda r: order[r.get("part", "own")])
    md = ["| engine | transport | dtype | MB | median s | min s | max s |", "|---|---|---|---:|---:|---:|---:|"]
    md += [f"| {r.get('engine', 'own sampler process')} | {r['transport']} | {r.get('dtype', 'float32')} | "
           f"{r['megabytes']} | {r['median_s']:.4f} | {r['min_s']:.4f} | {r['max_s']:.4f} |" for r in rows]
    RESULTS.mkdir(exist_ok=True)
    from posttrain.obs.machine import cpu_line

    (RESULTS / "weight_sync.json").write_text(json.dumps({"model": args.model, "rows": rows, "machine": cpu_line(),
                                                          "load_avg": os.getloadavg()}, indent=2))
    (RESULTS / "weight_sync.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
