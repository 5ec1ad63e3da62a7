"""The Trainer: forward_backward(batch, loss_fn) -> Update, optim_step(), save_state(), load_state().

It knows nothing about the algorithm beyond the loss function it is handed (algos/losses.py for the signature;
the stepper hands it the policy loss composed with its terms, algos/loss_terms.py): it packs each micro-batch's
per-sequence data into tensors (advantages, behaviour / reference / teacher log-probs, token weights) and runs the
loss on them. Gradients accumulate over micro-batches; the loss functions are given batch-wide normalizers,
so accumulation is exact rather than an average of micro-batch means. It implements `PolicyTrainer`
(training/protocol.py): what a step changes comes in as arguments, what a pass measured goes back in its `Update`.
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import torch

from posttrain.algos.kl import k3
from posttrain.algos.losses import LossInputs, LossParams
from posttrain.obs.memory import release_free_heap
from posttrain.training.batching import episode_tokens_B, plan_micro_batches
from posttrain.training.checkpointing import checkpoint_layers
from posttrain.training.logprobs import completion_logprobs
from posttrain.training.optimizers import build_optimizers
from posttrain.training.protocol import LossFn, StepSettings, TokenWeightFn, Update
from posttrain.types import Batch, Sequence

__all__ = ["PRECISIONS", "LossFn", "StepSettings", "TokenWeightFn", "Trainer", "Update", "atomic_torch_save"]


PRECISIONS = ("fp32", "bf16")


def compute_context(model: Any, precision: str):
    """Where the log-prob passes run: bf16 autocast (mixed precision) or as the model is. Under autocast the
    matmuls take bf16 copies of fp32 weights and gradients flow back into the fp32 parameters, so the optimizer
    and its state are untouched; token_logprobs upcasts the logits before the log-softmax. Why bf16: on a CPU with
    AVX-512 BF16 a forward and backward of the default model ran 1.7x faster than fp32 oneDNN (the RL update about
    1.2x); the price is about 0.04 nats of per-token log-prob error, which the behaviour-policy default (the
    sampler's log-probs, truncated IS) keeps out of the ratio, and on json-extract it learned less
    (docs/results/speed.md), so fp32 stays the default."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=next(model.parameters()).device.type, dtype=torch.bfloat16)


class Trainer:
    sharded = False  # a full model in this process (ShardedTrainer: an FSDP2 shard)

    def __init__(
        self,
        model: Any,
        pad_id: int,
        lr: float = 1e-5,
        weight_decay: float = 0.0,
        betas: tuple[float, float] = (0.9, 0.99),
        max_grad_norm: float = 1.0,
        warmup_steps: int = 0,
        micro_batch_tokens: int = 4096,
        prefix_sharing: bool = True,
        temperature: float = 1.0,
        optimizer: str = "adamw",
        muon_momentum: float = 0.95,
        logits_chunk_tokens: int = 0,
        gradient_checkpointing: bool = False,
        precision: str = "fp32",
        report_gap_max: bool = False,
    ):
        """`report_gap_max`: also log the largest per-token |trainer - sampler| log-prob gap of each step
        (`train/sampler_logp_abs_diff_max`), for rollouts from another engine (sampling.engine=vllm), where one bad
        token (a kernel, a missed push) shows there before the mean moves."""
        self.model = model
        self.report_gap_max = report_gap_max
        self.pad_id = pad_id
        self.max_grad_norm = max_grad_norm
        self.micro_batch_tokens = micro_batch_tokens
        self.prefix_sharing = prefix_sharing
        self.temperature = temperature if temperature > 0 else 1.0  # StepSettings.temperature None scores at it
        self.chunk = logits_chunk_tokens  # > 0: never hold a micro-batch's full logits (training/logprobs.py)
        if precision not in PRECISIONS:
            raise ValueError(f"trainer.precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
        self.precision = precision
        if gradient_checkpointing:  # keep each decoder layer's input only; backward re-runs the layer
            checkpoint_layers(model)
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.params = [p for _, p in named]
        if not self.params:
            raise ValueError("the model has no trainable parameters")
        self.optimizers = build_optimizers(named, optimizer, lr, betas, weight_decay, muon_momentum)
        self.schedulers = [
            torch.optim.lr_scheduler.LambdaLR(
                o, lambda s: min(1.0, (s + 1) / warmup_steps) if warmup_steps > 0 else 1.0
            )
            for o in self.optimizers
        ]
        self.step = 0
        self.skipped_steps = 0
        self._poisoned = False  # a non-finite loss was seen since the last optim_step

    # ---- compute -----------------------------------------------------------------------------------------
    @torch.no_grad()
    def compute_logprobs(
        self, batch: Batch, model: Any | None = None, temperature: float | None = None
    ) -> list[list[float]]:
        """Per-completion-token log-probs of each sequence under `model` (default: the policy), no gradients, at
        `temperature` (None: the trainer's)."""
        scorer: Any = self.model if model is None else model
        temperature = self._temperature(temperature)
        was = scorer.training
        scorer.eval()
        out: list[list[float]] = [[] for _ in batch.sequences]
        try:
            for groups in plan_micro_batches(batch, self.micro_batch_tokens):
                with compute_context(scorer, self.precision):
                    t = completion_logprobs(
                        scorer, groups, self.pad_id, temperature, self.prefix_sharing, chunk_tokens=self.chunk
                    )
                for row, (i, s) in enumerate(
                    (i, s) for g in groups for i, s in zip(g.indices, g.sequences, strict=True)
                ):
                    out[i] = t.logp_BT[row, : len(s.completion_ids)].tolist()
        finally:
            scorer.train(was)
        return out

    def _temperature(self, temperature: float | None) -> float:
        return self.temperature if temperature is None else (temperature if temperature > 0 else 1.0)

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
        """Accumulate gradients of loss_fn over the batch. Returns summed/averaged metrics, and the log-probs of
        the sequences whose `sample_id` is in `keep`, from this pass's forward (the report's token colouring
        needs them; taking them here saves a pass).

        Everything per sequence comes from the sequence: its advantage, the behaviour policy's log-probs
        (`old_logprobs`; None: the current policy, detached, i.e. on-policy), the reference's (`ref_logprobs`,
        needed when params.beta > 0) and the sampler's. `token_weight_fn` gives per-token weights per micro-batch
        (see TokenWeightFn), passed to the loss as LossInputs.token_weights_BT. `settings`: the scoring
        temperature and the entropy bonus of this step (its lr_scale is optim_step's).
        """
        if not batch.sequences:
            return Update({"train/empty_batch": 1.0})
        temperature = self._temperature(settings.temperature)
        keep = frozenset(keep)
        kept: dict[int, list[float]] = {}
        release_free_heap()  # what sampling freed goes back to the OS before activations and gradients grow
        self.model.train()
        # Batch-wide normalizers (the batch carries them when it holds only part of the optimizer batch).
        total_tokens = batch.total_loss_tokens or float(max(batch.num_loss_tokens, 1))
        total_seqs = batch.total_seqs or float(len(batch.sequences))
        sums: dict[str, float] = {}
        weights = 0.0
        loss_total = 0.0
        drift = _Drift()
        t0 = time.perf_counter()
        for groups in plan_micro_batches(batch, self.micro_batch_tokens):
            seqs = [s for g in groups for s in g.sequences]
            with compute_context(self.model, self.precision):
                t = completion_logprobs(
                    self.model,
                    groups,
                    self.pad_id,
                    temperature,
                    self.prefix_sharing,
                    with_entropy=True,
                    chunk_tokens=self.chunk,
                )
            B, T = t.logp_BT.shape
            dev = t.logp_BT.device
            entropy_BT = t.entropy_BT
            assert entropy_BT is not None  # asked for (with_entropy=True)
            want = [row for row, s in enumerate(seqs) if s.sample_id in keep]
            if want:  # only the rows asked for leave the device
                for row, lp in zip(want, t.logp_BT.detach()[want].float().cpu(), strict=True):
                    kept[_sample_id(seqs[row])] = lp[: len(seqs[row].completion_ids)].tolist()
            sampler_BT = _pad_float([s.sampler_logprobs for s in seqs], T).to(dev)
            old_BT = _behaviour_BT(seqs, t.logp_BT)
            has_ref = all(s.ref_logprobs is not None for s in seqs)
            ref_BT = _pad_float([s.ref_logprobs or [] for s in seqs], T).to(dev) if has_ref else None
            adv_B = torch.tensor([s.advantage for s in seqs], dtype=torch.float32, device=dev)
            w_BT, w_metrics = None, {}
            if token_weight_fn is not None:
                w_BT, w_metrics = token_weight_fn(t.logp_BT.detach(), sampler_BT, entropy_BT, t.mask_BT)
            inputs = LossInputs(
                total_tokens=total_tokens,
                total_seqs=total_seqs,
                token_weights_BT=w_BT,
                teacher_logp_BT=_teacher_BT(seqs, T, dev),
                entropy_coef=settings.entropy_coef,
                seq_tokens_B=episode_tokens_B(seqs, dev),
            )
            loss, m = loss_fn(t.logp_BT, old_BT, ref_BT, adv_B, t.mask_BT, params, inputs)
            m = {**m, **w_metrics}
            if not torch.isfinite(loss):
                self._poisoned = True
                self._skip_backward(t.logp_BT)
                continue
            release_free_heap()  # the forward's freed temporaries, before backward allocates the gradients
            loss.backward()
            loss_total += float(loss.detach())
            n_tok = float(t.mask_BT.sum())
            for k, v in m.items():
                sums[k] = sums.get(k, 0.0) + v * n_tok
            weights += n_tok
            drift.add(seqs, t.logp_BT, sampler_BT, entropy_BT, t.mask_BT)
        metrics = {f"train/{k}": v / max(weights, 1.0) for k, v in sums.items()}
        metrics.update(
            {
                "train/loss": loss_total,
                **drift.metrics(self.report_gap_max),
                "time/forward_backward": time.perf_counter() - t0,
            }
        )
        return Update(metrics, kept)

    def optim_step(self, lr_scale: float = 1.0) -> dict[str, float]:
        """Clip, step, zero. A step whose loss or gradient norm is not finite is skipped and counted. `lr_scale`:
        every learning rate times it for this step (a remedy's, obs/remedies.py)."""
        grad_norm = self.grad_norm_()
        skipped = self._poisoned or not math.isfinite(grad_norm)
        if not skipped:
            for o, sch in zip(self.optimizers, self.schedulers):
                for g in o.param_groups:
                    g["lr"] *= lr_scale
                o.step()
                for g in o.param_groups:
                    g["lr"] /= lr_scale
                sch.step()
        else:
            self.skipped_steps += 1
        for o in self.optimizers:
            o.zero_grad(set_to_none=True)
        release_free_heap()  # and the gradients' pages before the next sampling phase
        self._poisoned = False
        self.step += 1
        return {
            "train/grad_norm": grad_norm,
            "train/skipped_step": float(skipped),
            "train/skipped_steps_total": float(self.skipped_steps),
            "train/lr": float(self.schedulers[0].get_last_lr()[0]),
        }

    @property
    def nonfinite(self) -> bool:
        """A non-finite loss was seen since the last optim_step: that step will be skipped."""
        return self._poisoned

    def skip_next_step(self) -> None:
        """Skip the coming optim_step (another rank saw a non-finite loss: the ranks skip alike)."""
        self._poisoned = True

    def _skip_backward(self, logp_BT: torch.Tensor) -> None:
        """A non-finite loss is not backpropagated: the step will be skipped (a sharded trainer still runs a
        backward through `logp_BT`, a zero one, because the other ranks wait for its collectives)."""

    def grad_norm_(self) -> float:
        """Clip the gradients in place; their total norm before clipping (a sharded trainer combines its shards')."""
        return float(torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm))

    def close(self) -> None:
        """Nothing to release in one process (a DataParallelTrainer stops its ranks here)."""

    # ---- state -------------------------------------------------------------------------------------------
    def trainable_state(self) -> dict[str, torch.Tensor]:
        return {n: p.detach().clone() for n, p in self.model.named_parameters() if p.requires_grad}

    def full_params(self) -> dict[str, torch.Tensor]:
        """The full trainable weights (copies): in one process, the trainable state."""
        return self.trainable_state()

    def state_dict(self) -> dict[str, Any]:
        """Trainable weights (full model or LoRA adapter), optimizer, scheduler and counters."""
        return {
            "params": self.trainable_state(),
            "optimizers": [o.state_dict() for o in self.optimizers],
            "schedulers": [s.state_dict() for s in self.schedulers],
            "step": self.step,
            "skipped_steps": self.skipped_steps,
        }

    def save_state(self, path: str) -> None:
        """`state_dict()` written atomically (temp file, then rename): a crash never leaves a half-written state."""
        atomic_torch_save(self.state_dict(), path)

    def load_state(self, path: str) -> None:
        self.load_state_dict(torch.load(path, map_location="cpu", weights_only=False), source=path)

    def load_state_dict(self, state: dict[str, Any], source: str = "the checkpoint") -> None:
        path = source
        named = dict(self.model.named_parameters())
        missing = [n for n in state["params"] if n not in named]
        if missing:
            raise ValueError(f"checkpoint {path} has parameters this model lacks, e.g. {missing[:3]}")
        with torch.no_grad():
            for n, t in state["params"].items():
                named[n].copy_(t)
        # Checkpoints from before Muon held one optimizer under "optimizer".
        opt_states = state.get("optimizers") or [state["optimizer"]]
        sch_states = state.get("schedulers") or [state["scheduler"]]
        if len(opt_states) != len(self.optimizers):
            raise ValueError(
                f"checkpoint {path} has {len(opt_states)} optimizer states, this trainer has "
                f"{len(self.optimizers)} (was trainer.optimizer changed?)"
            )
        for o, os_, sch, ss in zip(self.optimizers, opt_states, self.schedulers, sch_states):
            o.load_state_dict(os_)
            sch.load_state_dict(ss)
        self.step = state["step"]
        self.skipped_steps = state["skipped_steps"]


@dataclass
class _Drift:
    """Entropy and the sampler-trainer log-prob gap over a pass's micro-batches (metrics only, no gradient)."""

    abs_sum: float = 0.0
    k3_sum: float = 0.0
    max_gap: float = 0.0
    drift_tokens: float = 0.0
    entropy_sum: float = 0.0
    tokens: float = 0.0

    @torch.no_grad()
    def add(
        self,
        seqs: list[Sequence],
        logp_BT: torch.Tensor,
        sampler_BT: torch.Tensor,
        entropy_BT: torch.Tensor,
        mask_BT: torch.Tensor,
    ) -> None:
        mask = mask_BT.float()
        drift = mask  # sampled under another prompt (guided) is not sampler-trainer drift
        if any(s.guided for s in seqs):
            drift = mask * torch.tensor([[0.0 if s.guided else 1.0] for s in seqs], device=mask.device)
        diff = (logp_BT.detach() - sampler_BT) * drift
        self.abs_sum += float(diff.abs().sum())
        self.max_gap = max(self.max_gap, float(diff.abs().max())) if diff.numel() else self.max_gap
        self.k3_sum += float((k3(sampler_BT - logp_BT.detach()) * drift).sum())
        self.drift_tokens += float(drift.sum())
        self.entropy_sum += float((entropy_BT * mask).sum())
        self.tokens += float(mask.sum())

    def metrics(self, with_max: bool) -> dict[str, float]:
        return {
            "train/entropy": self.entropy_sum / max(self.tokens, 1.0),
            # How far the sampler's log-probs are from the trainer's for the same tokens (off-policy drift).
            "train/sampler_logp_abs_diff": self.abs_sum / max(self.drift_tokens, 1.0),
            "train/sampler_kl_k3": self.k3_sum / max(self.drift_tokens, 1.0),
            "train/loss_tokens": self.tokens,
            **({"train/sampler_logp_abs_diff_max": self.max_gap} if with_max else {}),
        }


def _teacher_BT(seqs: list[Sequence], T: int, dev: torch.device) -> torch.Tensor | None:
    """The teacher's log-probs, NaN where it has no opinion; None when no sequence of the micro-batch has any."""
    if all(s.teacher_logprobs is None for s in seqs):
        return None
    return _pad_float([s.teacher_logprobs or [float("nan")] * len(s.completion_ids) for s in seqs], T).to(dev)


def _sample_id(s: Sequence) -> int:
    if s.sample_id is None:
        raise ValueError("forward_backward(keep=...) names sequences by sample_id; this one has none")
    return s.sample_id


def _behaviour_BT(seqs: list[Sequence], logp_BT: torch.Tensor) -> torch.Tensor:
    """The PPO ratio's old log-probs: each sequence's `old_logprobs`, or the current ones (detached) where None."""
    if all(s.old_logprobs is None for s in seqs):
        return logp_BT.detach()
    old_BT = logp_BT.detach().clone()
    for i, s in enumerate(seqs):
        if s.old_logprobs is not None:
            old_BT[i] = 0.0
            old_BT[i, : len(s.old_logprobs)] = torch.tensor(s.old_logprobs, dtype=old_BT.dtype, device=old_BT.device)
    return old_BT


def _pad_float(rows: list[list[float]], T: int) -> torch.Tensor:
    out = torch.zeros((len(rows), T), dtype=torch.float32)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r, dtype=torch.float32)
    return out


def atomic_torch_save(obj: Any, path: str) -> None:
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="tmp-", suffix=".partial", dir=d)
    os.close(fd)
    try:
        torch.save(obj, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
