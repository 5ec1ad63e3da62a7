"""What the loop needs from a trainer, as types: the `PolicyTrainer` protocol, the per-step settings it is handed,
and the `Update` that one forward-backward pass returns.

Three classes implement the protocol: `Trainer` (one process), `ShardedTrainer` (one rank of an FSDP2 shard,
training/fsdp.py) and `DataParallelTrainer` (rank 0 of a process group, training/distributed.py). Nothing outside a
trainer assigns to it: what changes from step to step (a remedy's temperature, learning-rate scale, entropy bonus)
is an argument of the call it affects, so a data-parallel trainer ships it with the command instead of broadcasting
an attribute assignment, and what a pass measured comes back in its result instead of being written into the batch.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from posttrain.algos.losses import LossParams
from posttrain.types import Batch

# (logp_BT, old_logp_BT, ref_logp_BT or None, adv_B, mask_BT, LossParams, LossInputs) -> (loss, metrics)
LossFn = Callable[..., tuple[torch.Tensor, dict[str, float]]]
# (logp_BT detached, sampler_logp_BT, entropy_BT, mask_BT) -> (token weights or None, metrics). The caller builds
# it from algos/ (importance-sampling correction, credit weights); the trainer just applies it per micro-batch.
TokenWeightFn = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor | None, dict[str, float]]
]


@dataclass(frozen=True)
class StepSettings:
    """What a remedy (obs/remedies.py) changes for a while, handed to each call it affects.

    `temperature`: the one tokens are scored at (the sampler's); None: the trainer's own (trainer.temperature,
    the configured sampling temperature). `lr_scale` multiplies every learning rate for one optimizer step;
    `entropy_coef` is the entropy bonus the loss subtracts (LossInputs.entropy_coef)."""

    temperature: float | None = None
    lr_scale: float = 1.0
    entropy_coef: float = 0.0


@dataclass(frozen=True)
class Update:
    """What `forward_backward` measured: its metrics, and the log-probs of the sequences it was asked to keep
    (`keep`, by `Sequence.sample_id`) from the pass's forward, taken before any optimizer step of this batch."""

    metrics: dict[str, float]
    logprobs: dict[int, list[float]] = field(default_factory=dict)


class PolicyTrainer(Protocol):
    """The trainer the loop drives (the stepper, the preflight's probe, a warm start, your own loop)."""

    model: Any  # the policy (a shard of it when `sharded`)
    pad_id: int
    temperature: float  # the default scoring temperature (StepSettings.temperature None)
    # Each rank holds a shard of the weights: gather them (`full_params`) before a sampler can load them.
    sharded: bool

    def forward_backward(
        self,
        batch: Batch,
        loss_fn: LossFn,
        params: LossParams,
        token_weight_fn: TokenWeightFn | None = None,
        *,
        settings: StepSettings = ...,
        keep: Collection[int] = ...,
    ) -> Update:
        """Accumulate the gradients of `loss_fn` over `batch`."""
        ...

    def optim_step(self, lr_scale: float = 1.0) -> dict[str, float]:
        """Clip, step (learning rates times `lr_scale`), zero."""
        ...

    def compute_logprobs(
        self, batch: Batch, model: Any | None = None, temperature: float | None = None
    ) -> list[list[float]]:
        """Per-completion-token log-probs of each sequence under `model` (default: the policy), in batch order."""
        ...

    def full_params(self) -> dict[str, torch.Tensor]:
        """The full trainable weights (a collective on a sharded trainer)."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any], source: str = "the checkpoint") -> None: ...

    def close(self) -> None: ...


def merge_logprobs(parts: list[dict[int, list[float]]]) -> dict[int, list[float]]:
    """The kept log-probs of several passes over disjoint parts of one batch, as one pass's."""
    return {k: v for p in parts for k, v in p.items()}
