"""A trainer over several processes (torch.distributed, gloo on CPU, NCCL on GPU), data parallel.

Rank 0 runs the whole loop (rollouts, env, eval, logging) and holds a `DataParallelTrainer`, which has the
Trainer's interface. Every other rank runs `worker_loop`: it holds a full model copy and its own Trainer and
does what rank 0 tells it over the process group:

    forward_backward(batch):  rank 0 splits the batch by whole groups (prefix sharing stays within a rank) and
                              sends each rank its shard; every shard keeps the *whole* batch's normalizers, so
                              the per-rank losses add up to exactly the one-process loss; each rank's metrics
                              and kept log-probs come back to rank 0 as one Update
    optim_step():             gradients summed across ranks in one flat all-reduce, the non-finite flag OR-ed,
                              then every rank clips and steps the same gradient: the weights stay identical

A step's settings (a remedy's temperature, learning-rate scale, entropy bonus: StepSettings) travel inside the
command they affect, so every rank scores and steps alike.

With trainer.sharding=fsdp2 each rank's Trainer is a ShardedTrainer (training/fsdp.py) over its FSDP2 shard:
FSDP2 reduce-scatters the gradients itself (optim_step only ORs the non-finite flag), and compute_logprobs (of
the policy), state_dict and full_params become commands every rank runs too. The run checkpoints once more after
`close`, so close gathers that last state before it stops the ranks.

Checkpoints are rank 0's trainer state (one full copy, the same format sharded or not), so a run resumes at any
world size. A rank that dies makes the next collective fail on rank 0 (the process group's timeout bounds the
wait): the run stops with a clear error and `--resume` continues from the last checkpoint.
"""

from __future__ import annotations

import datetime
import os
import sys
from collections.abc import Collection
from typing import Any

import torch
import torch.distributed as dist

from posttrain.algos.losses import LossParams
from posttrain.training.batching import group_sequences
from posttrain.training.protocol import LossFn, StepSettings, TokenWeightFn, Update, merge_logprobs
from posttrain.training.trainer import Trainer
from posttrain.types import Batch

SUMMED = ("train/loss", "train/loss_tokens")


class TrainerRankError(RuntimeError):
    """A trainer rank stopped answering or failed."""


def split_indices(batch: Batch, n: int) -> list[list[int]]:
    """n shards of whole groups, as indices into batch.sequences, balanced by tokens (largest first onto the
    lightest shard). Pure."""
    shards: list[list[int]] = [[] for _ in range(n)]
    load = [0] * n
    groups = sorted(
        group_sequences(batch), key=lambda g: -sum(len(s.prompt_ids) + len(s.completion_ids) for s in g.sequences)
    )
    for g in groups:
        r = load.index(min(load))
        shards[r] += g.indices
        load[r] += sum(len(s.prompt_ids) + len(s.completion_ids) for s in g.sequences)
    return shards


def split_by_groups(batch: Batch, n: int) -> list[Batch]:
    """`split_indices`' shards as batches, each carrying the whole batch's normalizers. Pure."""
    total_tokens = batch.total_loss_tokens or float(max(batch.num_loss_tokens, 1))
    total_seqs = batch.total_seqs or float(len(batch.sequences))
    return [
        Batch(
            [batch.sequences[i] for i in idx],
            batch.policy_version,
            total_loss_tokens=total_tokens,
            total_seqs=total_seqs,
        )
        for idx in split_indices(batch, n)
    ]


def combine_metrics(per_rank: list[dict[str, float]]) -> dict[str, float]:
    """One-process metrics from each rank's: loss and token counts add up, timings take the slowest rank, every
    other metric is a per-token mean, weighted by each rank's loss tokens."""
    tokens = [m.get("train/loss_tokens", 0.0) for m in per_rank]
    total = max(sum(tokens), 1.0)
    out: dict[str, float] = {}
    for k in {k for m in per_rank for k in m}:
        vals = [m.get(k, 0.0) for m in per_rank]
        if k in SUMMED:
            out[k] = sum(vals)
        elif k.startswith("time/"):
            out[k] = max(vals)
        elif k == "train/empty_batch":
            out[k] = float(all(m.get(k) for m in per_rank))
        else:
            out[k] = sum(v * w for v, w in zip(vals, tokens)) / total
    if "train/empty_batch" in out and not out["train/empty_batch"]:
        del out["train/empty_batch"]
    return out


def _all_reduce_grads(trainer: Trainer) -> None:
    """Sum the gradients over ranks in one flat buffer; OR the non-finite flag."""
    grads = []
    for p in trainer.params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        grads.append(p.grad)
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    off = 0
    for g in grads:
        g.copy_(flat[off : off + g.numel()].view_as(g))
        off += g.numel()
    flag = torch.tensor([float(trainer.nonfinite)], device=flat.device)  # NCCL reduces only CUDA tensors
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if flag.item():  # a rank saw a non-finite loss: every rank skips this step alike
        trainer.skip_next_step()


def _run(trainer, cmd: tuple, rank: int, world: int, loss_fn, params, token_weight_fn) -> Any:
    """Execute one command on this rank; returns what rank 0 needs back (or None)."""
    kind = cmd[0]
    if kind == "forward_backward":  # (kind, shards, settings, keep)
        u = trainer.forward_backward(cmd[1][rank], loss_fn, params, token_weight_fn, settings=cmd[2], keep=cmd[3])
        got: list = [None] * world
        dist.all_gather_object(got, u)
        return Update(combine_metrics([g.metrics for g in got]), merge_logprobs([g.logprobs for g in got]))
    if kind == "optim_step":  # (kind, lr_scale)
        if not trainer.sharded:  # FSDP2 already reduce-scattered them in forward_backward
            _all_reduce_grads(trainer)
        return trainer.optim_step(cmd[1])
    if kind == "compute_logprobs":  # FSDP2 only: each rank scores its shard, rank 0 gets every rank's
        got = [None] * world
        dist.all_gather_object(got, trainer.compute_logprobs(cmd[1][rank], temperature=cmd[2]))
        return got
    if kind == "state_dict":  # FSDP2 only: collective, the full state lands on rank 0
        return trainer.state_dict()
    if kind == "full_params":  # FSDP2 only: collective, the full weights land on rank 0 (weight sync)
        return trainer.full_params()
    if kind == "load_state_dict":  # (kind, state, source)
        trainer.load_state_dict(cmd[1], source=cmd[2])
        return None
    if kind == "broadcast_params":  # rank 0's weights to every rank (after a warm start, say)
        from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

        flat = _flatten_dense_tensors([p.detach() for p in trainer.params])
        dist.broadcast(flat, src=0)
        with torch.no_grad():
            for p, new in zip(trainer.params, _unflatten_dense_tensors(flat, trainer.params)):
                p.copy_(new)
        return None
    raise ValueError(f"unknown trainer command {kind!r}")


class DataParallelTrainer:
    """Rank 0's trainer: a PolicyTrainer (training/protocol.py), work spread over the process group's ranks."""

    def __init__(self, trainer: Trainer, world_size: int, workers: list | None = None):
        """`workers`: processes this rank started (closed with it); empty under torchrun."""
        self.trainer, self.world, self.workers = trainer, world_size, list(workers or [])
        self.model, self.pad_id, self.params = trainer.model, trainer.pad_id, trainer.params
        self.temperature = trainer.temperature
        # FSDP2 (training/fsdp.py): each rank's model is a shard, and rank 0's weights reached every rank before
        # it was cut (shard_model); every call that runs it is collective.
        self.sharded = trainer.sharded
        self._closed_state: dict[str, Any] | None = None
        if not self.sharded:
            self._send(("broadcast_params",))

    def _send(self, cmd: tuple, loss_fn=None, params=None, token_weight_fn=None):
        try:
            dist.broadcast_object_list([cmd], src=0)
            return _run(self.trainer, cmd, 0, self.world, loss_fn, params, token_weight_fn)
        except RuntimeError as e:  # gloo/NCCL raise RuntimeError when a peer is gone or times out
            raise TrainerRankError(f"a trainer rank failed during {cmd[0]}: {e} (resume with --resume RUN_DIR)") from e

    def forward_backward(
        self,
        batch: Batch,
        loss_fn: LossFn,
        params: LossParams,
        token_weight_fn: TokenWeightFn | None = None,
        *,
        settings: StepSettings = StepSettings(),
        keep: Collection[int] = (),
    ) -> Update:
        cmd = ("forward_backward", split_by_groups(batch, self.world), settings, frozenset(keep))
        u = self._send(cmd, loss_fn, params, token_weight_fn)
        return Update({**u.metrics, "train/world_size": float(self.world)}, u.logprobs)

    def optim_step(self, lr_scale: float = 1.0) -> dict[str, float]:
        return self._send(("optim_step", lr_scale))

    def compute_logprobs(
        self, batch: Batch, model: Any | None = None, temperature: float | None = None
    ) -> list[list[float]]:
        if not self.sharded or (model is not None and model is not self.model):
            # a full model on rank 0: no need to spread it
            return self.trainer.compute_logprobs(batch, model, temperature)
        parts = split_indices(batch, self.world)
        shards = [Batch([batch.sequences[i] for i in idx]) for idx in parts]
        got = self._send(("compute_logprobs", shards, temperature))
        out: list[list[float]] = [[] for _ in batch.sequences]
        for idx, lps in zip(parts, got, strict=True):
            for i, lp in zip(idx, lps, strict=True):
                out[i] = lp
        return out

    def state_dict(self) -> dict[str, Any]:
        if not self.sharded:
            return self.trainer.state_dict()
        if self._closed_state is not None:  # the run checkpoints once more after its ranks stopped
            return self._closed_state
        return self._send(("state_dict",))

    def full_params(self) -> dict[str, torch.Tensor]:
        """The full trainable weights on rank 0 (FSDP2: a collective every rank runs)."""
        if not self.sharded:
            return self.trainer.full_params()
        return self._send(("full_params",))

    def load_state_dict(self, state: dict[str, Any], source: str = "the checkpoint") -> None:
        self._send(("load_state_dict", state, source))

    def close(self, timeout_s: float = 30.0) -> None:
        if dist.is_initialized():
            try:
                if self.sharded:  # only the ranks together hold the state: gather it for the run's last checkpoint
                    self._closed_state = self.state_dict()
                dist.broadcast_object_list([("stop",)], src=0)
            except (RuntimeError, TrainerRankError):
                pass  # a rank is already gone; the processes are reaped below
            finally:
                dist.destroy_process_group()
        for w in self.workers:
            try:
                w.wait(timeout=timeout_s)
            except Exception:  # noqa: BLE001 - a worker that does not stop is killed, never waited on forever
                w.kill()


def worker_loop(trainer, loss_fn, params, token_weight_fn, rank: int, world: int) -> None:
    """Ranks 1..N-1: obey rank 0 until it says stop, then end this process (so does a failed group)."""
    while True:
        box: list = [None]
        dist.broadcast_object_list(box, src=0)
        if box[0][0] == "stop":
            dist.destroy_process_group()
            # End here, without the interpreter's teardown: rank 0 may already be closing the TCP store this
            # rank's gloo threads still hold, and a C++ thread destroyed mid-call at exit aborts the process
            # ("terminate called without an active exception", seen on a loaded machine). Nothing is left to do.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
        _run(trainer, box[0], rank, world, loss_fn, params, token_weight_fn)


def init_group(rank: int, world: int, timeout_s: float, backend: str | None = None) -> None:
    """Join the process group (MASTER_ADDR / MASTER_PORT from the environment, as torchrun sets them)."""
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=timeout_s))
