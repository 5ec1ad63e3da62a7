"""FSDP2 sharding of the trainer model (`trainer.sharding=fsdp2`, torch.distributed.fsdp.fully_shard).

Every rank wraps its model with `fully_shard`, each decoder layer and then the root, on a 1-D device mesh over
the trainer process group (gloo on CPU, NCCL on CUDA). A rank holds only its shard of the parameters, their
gradients and the optimizer state; a layer's full parameters exist only while it computes. `ShardedTrainer`
keeps the Trainer's interface; what changes is that every call touching the model is collective, so rank 0
sends it to every rank (training/distributed.py) and each rank runs it here:

    forward_backward   each micro-batch's forward gathers the layers one by one and its backward reduce-scatters
                       (sums) their gradients, so every rank must run the same passes in the same order (below)
    optim_step         the non-finite flag OR-ed over ranks; clip_grad_norm_ over the DTensor shards gives the
                       global norm; every rank steps its own shard
    compute_logprobs   each rank scores its own shard of the batch, in the same agreed passes (no gradients)
    state_dict         full tensors on rank 0 (CPU), in the plain Trainer's format: a checkpoint resumes at any
                       world size, sharded or not
    full_params        the full trainable weights on rank 0, for the sampler's own copy (loop/weight_sync.py)

The same passes on every rank: the ranks' shards differ, but a pass's collectives depend only on how many times
it calls the model, which is one call per micro-batch, or two under prefix sharing (the prompt, then the
completion after its first token) unless every completion has one token. So each rank splits its shard by that
kind, the ranks agree on the most passes of each kind (one all-reduce), and a rank with fewer (an empty shard
included) makes up the difference with idle passes of that kind: padding tokens with no loss, a zero gradient.
A micro-batch whose loss is not finite still runs a backward, of zero; the step is skipped on every rank.

With `trainer.logits_chunk_tokens` the output projection is applied outside the model's own forward, which FSDP
does not see; there the parameters are instead gathered once per call and kept whole through its micro-batches
(gradients reduce-scattered once at the end), which costs a full copy of the parameters and gradients during
the call, as data parallel does.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from contextlib import contextmanager
from typing import Any, cast

import torch
import torch.distributed as dist

from posttrain.algos.losses import LossParams
from posttrain.training.batching import group_sequences, plan_micro_batches
from posttrain.training.logprobs import completion_logprobs
from posttrain.training.protocol import LossFn, StepSettings, TokenWeightFn, Update, merge_logprobs
from posttrain.training.trainer import Trainer, compute_context
from posttrain.types import Batch, Sequence

KINDS = (1, 2)  # model calls per micro-batch (see the module docstring)


def decoder_layers(model: Any) -> list[torch.nn.Module]:
    """The blocks to shard one by one: HF models name their layer class in `_no_split_modules`."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(
            f"{type(model).__name__} names no decoder layer class (_no_split_modules): cannot shard it "
            "per layer; use trainer.sharding=none"
        )
    return layers


def _broadcast_from_rank0(model: torch.nn.Module) -> None:
    """Rank 0's weights to every rank before sharding, so each rank's shard is cut from the same full model."""
    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            dist.broadcast(t.data, src=0)


def shard_model(model: torch.nn.Module, world: int) -> torch.nn.Module:
    """Collective: every rank calls it with a model of the same architecture; returns it sharded in place."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard

    device = next(model.parameters()).device
    _broadcast_from_rank0(model)
    mesh = init_device_mesh(device.type, (world,))
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for m in model.modules():
        if isinstance(m, FSDPModule):
            # Sum, not FSDP's default mean: each rank's loss already carries the whole batch's normalizers
            # (distributed.split_by_groups), so the per-rank gradients add up to the one-process gradient.
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)  # plain SUM: gloo has no PREMUL_SUM (a factor of 1 needs it)
    return model


def _fsdp_modules(model: torch.nn.Module) -> list[Any]:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


class ShardedTrainer(Trainer):
    """A rank's Trainer over its FSDP2-sharded model; every method that runs the model is a collective."""

    sharded = True

    def __init__(self, model: Any, pad_id: int, **kw: Any):
        """`model`: already sharded (`shard_model`), so the optimizer holds the DTensor shards."""
        super().__init__(model, pad_id, **kw)
        self._fsdp = _fsdp_modules(model)
        self._trainable = [n for n, p in model.named_parameters() if p.requires_grad]
        self.streaming = not self.chunk  # layer by layer, unless the chunked projection bypasses the model's forward
        # FSDP initializes its state lazily in the root's first forward; the chunked log-prob path calls the
        # decoder without the root, so run that first forward now, on every rank.
        with torch.no_grad():
            self.model(input_ids=self._dummy_ids())

    def _device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _dummy_ids(self) -> torch.Tensor:
        return torch.tensor([[self.pad_id]], device=self._device())

    # ---- the same passes on every rank (streaming) -------------------------------------------------------
    def _kind(self, s: Sequence) -> int:
        """Model calls of a micro-batch holding `s` (training/logprobs.completion_logprobs): prefix sharing calls
        it for the prompts, then again for the completions after their first token, if any has more than one."""
        return 2 if self.prefix_sharing and len(s.completion_ids) > 1 else 1

    def _by_kind(self, batch: Batch) -> list[tuple[list[int], Batch]]:
        """The batch split by kind (indices into it, and a batch with the whole batch's normalizers): every
        micro-batch of a part has that part's kind."""
        total_tokens = batch.total_loss_tokens or float(max(batch.num_loss_tokens, 1))
        total_seqs = batch.total_seqs or float(len(batch.sequences))
        out = []
        for kind in KINDS:
            idx = [i for i, s in enumerate(batch.sequences) if self._kind(s) == kind]
            out.append(
                (
                    idx,
                    Batch(
                        [batch.sequences[i] for i in idx],
                        batch.policy_version,
                        total_loss_tokens=total_tokens,
                        total_seqs=total_seqs,
                    ),
                )
            )
        return out

    def _agreed_passes(self, parts: list[Batch]) -> list[tuple[int, int]]:
        """(this rank's micro-batches, the most any rank has) per kind: one all-reduce."""
        mine = [len(plan_micro_batches(p, self.micro_batch_tokens)) for p in parts]
        most = torch.tensor(mine, dtype=torch.float64, device=self._device())  # NCCL reduces only CUDA tensors
        dist.all_reduce(most, op=dist.ReduceOp.MAX)
        return list(zip(mine, (int(n) for n in most.tolist())))

    def _idle_pass(self, kind: int, backward: bool) -> None:
        """The model calls of a real pass of this kind, on padding with no loss: its collectives, a zero gradient."""
        seq = Sequence(
            prompt_ids=[self.pad_id],
            completion_ids=[self.pad_id] * kind,
            loss_mask=[0] * kind,
            sampler_logprobs=[0.0] * kind,
        )
        with torch.set_grad_enabled(backward), compute_context(self.model, self.precision):
            t = completion_logprobs(
                self.model,
                group_sequences(Batch([seq])),
                self.pad_id,
                self.temperature,
                self.prefix_sharing,
                chunk_tokens=self.chunk,
            )
            if backward:
                (t.logp_BT.sum() * 0.0).backward()

    def _skip_backward(self, logp_BT: torch.Tensor) -> None:
        if self.streaming:  # the other ranks wait for this backward's reduce-scatters: a zero gradient
            (logp_BT.sum() * 0.0).backward()

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
        if not self.streaming:
            try:
                with self._whole():
                    return super().forward_backward(
                        batch, loss_fn, params, token_weight_fn, settings=settings, keep=keep
                    )
            finally:
                self._reduce_grads()
        parts = self._by_kind(batch)
        done = []
        for kind, (_, part), (mine, most) in zip(KINDS, parts, self._agreed_passes([p for _, p in parts])):
            done.append(super().forward_backward(part, loss_fn, params, token_weight_fn, settings=settings, keep=keep))
            for _ in range(most - mine):
                self.model.train()
                self._idle_pass(kind, backward=True)
        return Update(_merge([u.metrics for u in done]), merge_logprobs([u.logprobs for u in done]))

    @torch.no_grad()
    def compute_logprobs(
        self, batch: Batch, model: Any | None = None, temperature: float | None = None
    ) -> list[list[float]]:
        if model is not None and model is not self.model:  # a full model of its own (reference, teacher): local
            return super().compute_logprobs(batch, model, temperature)
        if not self.streaming:
            try:
                with self._whole():
                    return super().compute_logprobs(batch, temperature=temperature)
            finally:
                self._reshard()
        parts = self._by_kind(batch)
        out: list[list[float]] = [[] for _ in batch.sequences]
        for kind, (idx, part), (mine, most) in zip(KINDS, parts, self._agreed_passes([p for _, p in parts])):
            for i, lp in zip(idx, super().compute_logprobs(part, temperature=temperature), strict=True):
                out[i] = lp
            was = self.model.training
            self.model.eval()
            for _ in range(most - mine):
                self._idle_pass(kind, backward=False)
            self.model.train(was)
        return out

    # ---- gathered once per call (the chunked output projection) -----------------------------------------
    @contextmanager
    def _whole(self) -> Iterator[None]:
        """Gather every layer's parameters once and keep them whole (no resharding, no gradient reduction) until
        the block ends, so what runs inside it is local to this rank."""
        for m in self._fsdp:
            m.set_reshard_after_forward(False)
            m.set_reshard_after_backward(False)
            m.set_requires_gradient_sync(False)
            m.unshard()
        yield

    def _reshard(self) -> None:
        for m in self._fsdp:
            m.reshard()

    def _reduce_grads(self) -> None:
        """One pass with a zero loss through the root: its backward reduce-scatters the gradients accumulated in
        `_whole` (plus zeros) on every rank alike, whatever each rank's batch was, then reshards."""
        for m in self._fsdp:
            m.set_requires_gradient_sync(True)
            m.set_reshard_after_backward(True)
        self.model.train()
        out = self.model(input_ids=self._dummy_ids()).logits
        (out.sum() * 0.0).backward()
        self._reshard()

    def optim_step(self, lr_scale: float = 1.0) -> dict[str, float]:
        # Each rank saw only its micro-batches' losses: skip the step everywhere if any rank saw a non-finite one.
        flag = torch.tensor([float(self._poisoned)], device=self._device())
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        self._poisoned = bool(flag.item())
        return super().optim_step(lr_scale)

    def grad_norm_(self) -> float:
        # The DTensor-aware clip: each shard's norm is combined across ranks into the global norm (Replicate).
        norm = torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm)
        full = getattr(norm, "full_tensor", None)  # a DTensor (Replicate) when the parameters are shards
        return float(full() if full is not None else norm)

    # ---- state: full tensors on rank 0 -----------------------------------------------------------------------
    def full_params(self) -> dict[str, torch.Tensor]:
        """Collective: the full trainable weights on rank 0 (CPU), {} on the others."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return {n: cast(torch.Tensor, full[n]) for n in self._trainable if n in full}

    def _param_names(self, opt: torch.optim.Optimizer) -> list[str]:
        """The optimizer's parameters by name, in the order its own state_dict numbers them."""
        named = list(self.model.named_parameters())  # a few hundred: matched by identity (`is`)
        return [next(n for n, q in named if q is p) for g in opt.param_groups for p in g["params"]]

    def state_dict(self) -> dict[str, Any]:
        """Collective: the plain Trainer's state (weights and optimizer state keyed by index) on rank 0, {} on the
        others."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        params = self.full_params()
        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        optim = [get_optimizer_state_dict(self.model, o, options=opts) for o in self.optimizers]
        if dist.get_rank() != 0:
            return {}
        return {
            "params": params,
            "optimizers": [_by_index(s, self._param_names(o)) for s, o in zip(optim, self.optimizers)],
            "schedulers": [s.state_dict() for s in self.schedulers],
            "step": self.step,
            "skipped_steps": self.skipped_steps,
        }

    def load_state_dict(self, state: dict[str, Any], source: str = "the checkpoint") -> None:
        """Collective; every rank is handed the full state (a plain Trainer's, from any world size) and keeps its
        shard of it."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        missing = [n for n in state["params"] if n not in set(self._trainable)]
        if missing:
            raise ValueError(f"checkpoint {source} has parameters this model lacks, e.g. {missing[:3]}")
        opt_states = state.get("optimizers") or [state["optimizer"]]
        sch_states = state.get("schedulers") or [state["scheduler"]]
        if len(opt_states) != len(self.optimizers):
            raise ValueError(
                f"checkpoint {source} has {len(opt_states)} optimizer states, this trainer has "
                f"{len(self.optimizers)} (was trainer.optimizer changed?)"
            )
        opts = StateDictOptions(full_state_dict=True, strict=False)
        set_model_state_dict(self.model, state["params"], options=opts)
        for o, os_, sch, ss in zip(self.optimizers, opt_states, self.schedulers, sch_states):
            set_optimizer_state_dict(self.model, o, _by_name(os_, self._param_names(o)), options=opts)
            sch.load_state_dict(ss)
        self.step = state["step"]
        self.skipped_steps = state["skipped_steps"]


def _by_index(named: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """A full optimizer state keyed by parameter name (torch.distributed.checkpoint) -> keyed by index, as
    `Optimizer.state_dict()` writes it (a plain Trainer loads it)."""
    index = {n: i for i, n in enumerate(names)}
    groups = [{**g, "params": [index[n] for n in g["params"]]} for g in named["param_groups"]]
    return {"state": {index[n]: s for n, s in named["state"].items()}, "param_groups": groups}


def _by_name(indexed: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """The inverse of `_by_index`: a plain Trainer's optimizer state for `set_optimizer_state_dict`."""
    groups = [{**g, "params": [names[i] for i in g["params"]]} for g in indexed["param_groups"]]
    return {"state": {names[int(i)]: s for i, s in indexed["state"].items()}, "param_groups": groups}


def _merge(ms: list[dict[str, float]]) -> dict[str, float]:
    """The metrics of forward_backward over the parts of one shard, as one call over the shard would give them."""
    from posttrain.training.distributed import combine_metrics

    done = [m for m in ms if "train/empty_batch" not in m]
    if len(done) <= 1:
        return done[0] if done else ms[0]
    out = combine_metrics(done)
    out["time/forward_backward"] = sum(m["time/forward_backward"] for m in done)  # one after the other
    return out
