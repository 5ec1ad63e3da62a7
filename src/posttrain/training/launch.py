"""Starting trainer ranks: `trainer.world_size=N` starts N-1 worker processes beside this one, or the ranks come
from `torchrun` (RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT in the environment).

    rank 0     the whole run (loop/run.py); its Trainer is a DataParallelTrainer (training/distributed.py)
    rank k>0   `python -m posttrain.training.launch TIMEOUT_S` (or the CLI under torchrun): joins the group, receives
               the `RankPlan` from rank 0 (training/rank_plan.py; never the Config or the task), builds the same
               model, Trainer and loss from it, then obeys rank 0

With trainer.sharding=fsdp2 each rank's Trainer is a ShardedTrainer over its FSDP2 shard (training/fsdp.py); on
rank 0 the shard is cut from a copy, so the run's own model stays whole for the sampler, eval and final/.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from posttrain.training.rank_plan import RankPlan, TrainerSetup


def world_size(configured: int) -> int:
    """torchrun's WORLD_SIZE wins over `configured` (trainer.world_size)."""
    return int(os.environ.get("WORLD_SIZE", configured))


def launched_rank() -> int:
    return int(os.environ.get("RANK", 0))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_trainer(setup: TrainerSetup, model, pad_id: int, world: int):
    """This rank's Trainer, once it has joined the group: over the whole model (data parallel), or over its FSDP2
    shard of it (trainer.sharding=fsdp2; cutting the shards is collective, so every rank calls this in step)."""
    from posttrain.training.from_config import make_trainer

    if setup.trainer.sharding == "fsdp2":
        from posttrain.training.fsdp import ShardedTrainer, shard_model

        return make_trainer(setup, shard_model(model, world), pad_id, cls=ShardedTrainer)
    return make_trainer(setup, model, pad_id)


def start_ranks(plan: RankPlan, model, pad_id: int):
    """On rank 0: start the other ranks unless torchrun did, join the group, send every rank the plan, return a
    DataParallelTrainer over `model` (data parallel: the run's own module) or over a sharded copy of it (fsdp2)."""
    import copy

    import torch.distributed as dist

    from posttrain.training.distributed import DataParallelTrainer, init_group

    t = plan.setup.trainer
    world = world_size(t.world_size)
    workers = []
    if "RANK" not in os.environ:  # our own launch: the workers are this process's children
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(_free_port())
        threads = str(max(1, (os.cpu_count() or 1) // world))
        for rank in range(1, world):
            env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "OMP_NUM_THREADS": threads}
            workers.append(
                subprocess.Popen([sys.executable, "-m", "posttrain.training.launch", str(t.dist_timeout_s)], env=env)
            )
    init_group(0, world, t.dist_timeout_s)
    dist.broadcast_object_list([plan.model_dump_json()], src=0)
    if t.sharding == "fsdp2":
        model = copy.deepcopy(model)  # the sampler keeps the whole one (GatheredWeights refreshes it)
    return DataParallelTrainer(rank_trainer(plan.setup, model, pad_id, world), world, workers)


def run_worker(dist_timeout_s: float) -> None:
    """A rank > 0: join the group, receive rank 0's plan, build the same model, Trainer and loss, then the worker
    loop until rank 0 says stop."""
    import torch
    import torch.distributed as dist

    from posttrain.models.load import ensure_pad_token, load_model
    from posttrain.models.lora import apply_lora
    from posttrain.models.policy import resolve_device, resolve_dtype, seed_everything
    from posttrain.training.distributed import init_group, worker_loop
    from posttrain.training.from_config import LossSetup

    rank, world = launched_rank(), int(os.environ["WORLD_SIZE"])  # set by start_ranks or torchrun
    if torch.cuda.is_available():  # NCCL: the plan's broadcast below already runs on this rank's GPU
        torch.cuda.set_device(rank % torch.cuda.device_count())
    init_group(rank, world, dist_timeout_s)
    box: list = [None]
    dist.broadcast_object_list(box, src=0)
    plan = RankPlan.model_validate_json(box[0])
    m, lora = plan.model, plan.lora
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", 1)))
    seed_everything(plan.seed)
    device = resolve_device(m.device)
    if device.startswith("cuda"):
        device = f"cuda:{rank % torch.cuda.device_count()}"  # one GPU per rank on this host
    model, tok = load_model(
        m.name, resolve_dtype(m.dtype, device), m.attn_implementation, seed=plan.seed, log=lambda s: None
    )
    model = model.to(device)
    ensure_pad_token(tok)
    if lora.enabled:
        model = apply_lora(model, lora.r, lora.alpha, lora.dropout, lora.target_modules)
    trainer = rank_trainer(plan.setup, model, tok.pad_token_id, world)
    loss = LossSetup.build(plan.algorithm, plan.params())  # the loss rank 0's stepper runs, as it decided it
    worker_loop(trainer, loss.loss_fn, loss.params, loss.token_weight_fn, rank, world)


if __name__ == "__main__":
    run_worker(float(sys.argv[1]))
