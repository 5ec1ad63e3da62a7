"""Weight sync from a trainer process to a sampler process, by transport: median seconds of 5 pushes.

    python bench/weight_sync.py [--model default] [--repeats 5] [--lora-r 16]

For each transport the trainer changes its weights, pushes them, and the time is taken until the sampler process
holds them (it confirms over a queue; the confirmation's own latency, about a millisecond, is included):

- in-process copy (CopyWeights, the async loop today): into a second model in the same process
- shared memory (SharedMemoryWeights): one copy into a block the sampler process's parameters are views of
- torch.distributed broadcast over gloo (BroadcastWeights -> BroadcastReceiver)
- file (FileWeights, safetensors + rename) and the sampler's read of it
- LoRA adapter-only: shared memory with only the adapter tensors (rank --lora-r on all linear layers)

Prints a table, writes bench/results/weight_sync.{json,md}. Goals (scale-out issue): shared memory <= 0.3 s for
the default model's ~538 MB of fp32 weights; LoRA adapter-only <= 50 ms.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import multiprocessing as mp
import os
import socket
import statistics
import tempfile
import time
from pathlib import Path

import torch

from posttrain.sampling.weight_ipc import (BroadcastReceiver, BroadcastWeights, FileWeights, SharedMemoryWeights,
                                       SharedWeightsReceiver, read_file_weights, trainable_state)
from posttrain.loop.weight_sync import CopyWeights

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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="default")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--lora-r", type=int, default=16)
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = load(args.model, 0)
    mb = sum(t.numel() * t.element_size() for t in trainable_state(model).values()) / 1e6
    lora = load(args.model, args.lora_r)
    lora_mb = sum(t.numel() * t.element_size() for t in trainable_state(lora).values()) / 1e6
    rows = []
    for name, size, fn in [
        ("in-process copy", mb, lambda: bench_copy(model, args.repeats)),
        ("shared memory", mb, lambda: bench_shm(model, args.model, 0, args.repeats)),
        ("broadcast (gloo)", mb, lambda: bench_broadcast(model, args.model, args.repeats)),
        ("file (safetensors)", mb, lambda: bench_file(model, args.model, args.repeats)),
        (f"LoRA r={args.lora_r}, shared memory", lora_mb, lambda: bench_shm(lora, args.model, args.lora_r,
                                                                             args.repeats)),
        (f"LoRA r={args.lora_r}, in-process copy", lora_mb, lambda: bench_copy(lora, args.repeats)),
    ]:
        times = fn()
        rows.append({"transport": name, "megabytes": round(size, 1), "median_s": statistics.median(times),
                     "min_s": min(times), "max_s": max(times), "repeats": len(times)})
        print(f"{name:<34} {size:8.1f} MB  median {rows[-1]['median_s']:.4f} s  "
              f"[{min(times):.4f}, {max(times):.4f}]", flush=True)
    md = ["| transport | MB | median s | min s | max s |", "|---|---:|---:|---:|---:|"]
    md += [f"| {r['transport']} | {r['megabytes']} | {r['median_s']:.4f} | {r['min_s']:.4f} | {r['max_s']:.4f} |"
           for r in rows]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "weight_sync.json").write_text(json.dumps({"model": args.model, "rows": rows,
                                                          "load_avg": os.getloadavg()}, indent=2))
    (RESULTS / "weight_sync.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
