"""Cross-process weight sync: shared memory and torch.distributed broadcast with two CPU processes, files."""

import multiprocessing as mp
import os
import socket

import pytest
import torch

from posttrain.sampling.weight_ipc import (BroadcastReceiver, BroadcastWeights, FileWeights, SharedMemoryWeights,
                                       SharedWeightsReceiver, WeightSyncError, read_file_weights, tensor_specs,
                                       trainable_state)


def _model(seed):
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    m[0].bias.requires_grad_(False)  # frozen tensors are not synced
    return m


def _sampler_process(name, specs, lock, requests, replies):
    torch.set_num_threads(1)
    model = _model(seed=1)  # different weights until bound
    recv = SharedWeightsReceiver(name, specs, lock)
    recv.bind(model)
    while (msg := requests.get(timeout=60)) != "stop":
        if msg == "hold":  # keep the lock, as a long decode would
            with recv.guard():
                replies.put("holding")
                requests.get(timeout=60)
            continue
        with recv.guard() as version:
            replies.put((version, {n: p.detach().numpy().copy() for n, p in model.named_parameters()}))
    recv.close()


def test_shared_memory_push_is_seen_by_the_sampler_process_in_place():
    ctx = mp.get_context("spawn")
    trainer_model, lock = _model(seed=0), ctx.Lock()
    sync = SharedMemoryWeights(trainer_model, lock, timeout_s=0.3, retries=1)
    requests, replies = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_sampler_process, args=(*sync.receiver_args(), lock, requests, replies))
    proc.start()
    try:
        sync.push(1)
        requests.put("get")
        version, seen = replies.get(timeout=60)
        assert version == 1
        seen = {n: torch.from_numpy(v) for n, v in seen.items()}
        for n, p in trainable_state(trainer_model).items():
            assert torch.equal(seen[n], p), n
        assert not torch.equal(seen["0.bias"], trainer_model[0].bias)  # frozen: the sampler keeps its own
        with torch.no_grad():
            for p in trainer_model.parameters():
                p.add_(1.0)
        sync.push(2)
        requests.put("get")
        version, seen = replies.get(timeout=60)
        assert version == 2 and torch.equal(torch.from_numpy(seen["2.weight"]), trainer_model[2].weight)
        # A sampler mid-decode holds the lock: the push times out and retries, then fails clearly.
        requests.put("hold")
        assert replies.get(timeout=60) == "holding"
        with pytest.raises(WeightSyncError, match="2 tries"):
            sync.push(3)
        requests.put("release")
        requests.put("get")
        version, _ = replies.get(timeout=60)
        assert version == 2  # the failed push changed nothing
    finally:
        requests.put("stop")
        proc.join(timeout=60)
        sync.close()
    assert proc.exitcode == 0


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _broadcast_rank(rank, port, out):
    import datetime

    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
    model = _model(seed=rank)
    if rank == 0:
        with torch.no_grad():
            model[2].weight.mul_(3.0)
        BroadcastWeights(model).push(7)
    else:
        version = BroadcastReceiver(model).pull()
        # numpy arrays pickle by value; torch tensors would travel as file descriptors of this process, gone
        # once it exits
        out.put((version, {n: p.detach().numpy().copy() for n, p in model.named_parameters()}))
    dist.barrier()
    dist.destroy_process_group()


def test_broadcast_over_gloo_delivers_the_trainer_weights():
    ctx = mp.get_context("spawn")
    out, port = ctx.Queue(), _free_port()
    procs = [ctx.Process(target=_broadcast_rank, args=(r, port, out)) for r in (0, 1)]
    for p in procs:
        p.start()
    version, seen = out.get(timeout=120)
    for p in procs:
        p.join(timeout=60)
    assert [p.exitcode for p in procs] == [0, 0]
    want = _model(seed=0)
    with torch.no_grad():
        want[2].weight.mul_(3.0)
    assert version == 7
    seen = {n: torch.from_numpy(v) for n, v in seen.items()}
    for n, p in trainable_state(want).items():
        assert torch.equal(seen[n], p), n
    assert torch.equal(seen["0.bias"], _model(seed=1)[0].bias)  # frozen: not sent


def test_file_weights_round_trip(tmp_path):
    src, dst = _model(0), _model(1)
    FileWeights(src, tmp_path / "w").push(4)
    assert read_file_weights(tmp_path / "w", dst) == 4
    for n, p in trainable_state(src).items():
        assert torch.equal(dict(dst.named_parameters())[n], p)
    assert not list((tmp_path / "w").glob("*.partial"))


def test_lora_syncs_only_the_adapter(tiny):
    from posttrain.models.lora import apply_lora

    model, _ = tiny
    lora = apply_lora(model, r=4, alpha=8.0, dropout=0.0, target_modules=["q_proj", "v_proj"])
    names = list(trainable_state(lora))
    assert names and all("lora_" in n for n in names)
    full = sum(p.numel() for p in lora.parameters())
    assert sum(s.nbytes for s in tensor_specs(trainable_state(lora))) < 0.1 * 4 * full


def test_tensor_specs_are_aligned_and_disjoint():
    specs = tensor_specs({"a": torch.zeros(3), "b": torch.zeros(5, dtype=torch.float16), "c": torch.zeros(2, 2)})
    assert all(s.offset % 64 == 0 for s in specs)
    assert all(a.offset + a.nbytes <= b.offset for a, b in zip(specs, specs[1:]))
