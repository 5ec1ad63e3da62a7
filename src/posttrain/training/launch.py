"""Starting trainer ranks: `trainer.world_size=N` starts N-1 worker processes beside this one, or the ranks come
from `torchrun` (RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT in the environment).

    rank 0     the whole run (loop/run.py); its Trainer is a DataParallelTrainer (training/distributed.py)
    rank k>0   `python -m posttrain.training.launch CONFIG.yaml`: builds the same model and Trainer, then obeys rank 0

With trainer.sharding=fsdp2 each rank's Trainer is a ShardedTrainer over its FSDP2 shard (training/fsdp.py); on
rank 0 the shard is cut from a copy, so the run's own model stays whole for the sampler, eval and final/.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from posttrain.config.schema import Config


def world_size(cfg: Config) -> int:
    """torchrun's WORLD_SIZE wins over trainer.world_size."""
    return int(os.environ.get("WORLD_SIZE", cfg.trainer.world_size))


def launched_rank() -> int:
    return int(os.environ.get("RANK", 0))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_trainer(cfg: Config, model, pad_id: int, world: int):
    """This rank's Trainer, once it has joined the group: over the whole model (data parallel), or over its FSDP2
    shard of it (trainer.sharding=fsdp2; cutting the shards is collective, so every rank calls this in step)."""
    from posttrain.training.from_config import make_trainer

    if cfg.trainer.sharding == "fsdp2":
        from posttrain.training.fsdp import ShardedTrainer, shard_model

        return make_trainer(cfg, shard_model(model, world), pad_id, cls=ShardedTrainer)
    return make_trainer(cfg, model, pad_id)


def start_ranks(cfg: Config, model, pad_id: int, config_path: Path):
    """On rank 0: start the other ranks unless torchrun did, join the group, return a DataParallelTrainer over
    `model` (data parallel: the run's own module) or over a sharded copy of it (fsdp2)."""
    import copy

    from posttrain.training.distributed import DataParallelTrainer, init_group

    world = world_size(cfg)
    workers = []
    if "RANK" not in os.environ:  # our own launch: the workers are this process's children
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(_free_port())
        threads = str(max(1, (os.cpu_count() or 1) // world))
        for rank in range(1, world):
            env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "OMP_NUM_THREADS": threads}
            workers.append(
                subprocess.Popen([sys.executable, "-m", "posttrain.training.launch", str(config_path)], env=env)
            )
    init_group(0, world, cfg.trainer.dist_timeout_s)
    if cfg.trainer.sharding == "fsdp2":
        model = copy.deepcopy(model)  # the sampler keeps the whole one (GatheredWeights refreshes it)
    return DataParallelTrainer(rank_trainer(cfg, model, pad_id, world), world, workers)


def run_worker(cfg: Config) -> None:
    """A rank > 0: the same model and Trainer as rank 0, then the worker loop until rank 0 says stop."""
    import torch

    from posttrain.models.load import ensure_pad_token, load_model
    from posttrain.models.lora import apply_lora
    from posttrain.models.policy import resolve_device, resolve_dtype, seed_everything
    from posttrain.tasks.from_config import task_from_config
    from posttrain.training.distributed import init_group, worker_loop
    from posttrain.training.from_config import LossSetup

    rank, world = launched_rank(), world_size(cfg)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", 1)))
    seed_everything(cfg.run.seed)
    device = resolve_device(cfg.model.device)
    if device.startswith("cuda"):
        device = f"cuda:{rank % torch.cuda.device_count()}"  # one GPU per rank on this host
    model, tok = load_model(
        cfg.model.name,
        resolve_dtype(cfg.model.dtype, device),
        cfg.model.attn_implementation,
        seed=cfg.run.seed,
        log=lambda s: None,
    )
    model = model.to(device)
    ensure_pad_token(tok)
    if cfg.lora.enabled:
        model = apply_lora(model, cfg.lora.r, cfg.lora.alpha, cfg.lora.dropout, cfg.lora.target_modules)
    task = task_from_config(cfg.task, seed=cfg.run.seed)  # a dataset task too: its max_tokens is the run's
    max_tokens = cfg.sampling.max_tokens or task.max_tokens or 128
    init_group(rank, world, cfg.trainer.dist_timeout_s)
    trainer = rank_trainer(cfg, model, tok.pad_token_id, world)
    loss = LossSetup.from_config(cfg, max_tokens)  # the same loss as rank 0's stepper
    worker_loop(trainer, loss.loss_fn, loss.params, loss.token_weight_fn, rank, world)


if __name__ == "__main__":
    from posttrain.config import load_config

    run_worker(load_config(sys.argv[1], []))
