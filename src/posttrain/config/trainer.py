"""The `trainer:` and `warm_start:` sections: the optimizer and its passes, and the supervised warm start."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from posttrain.config.strict import Strict


class TrainerConfig(Strict):
    lr: float = Field(default=2e-5, gt=0.0, description="AdamW learning rate")
    weight_decay: float = Field(default=0.0, ge=0.0, description="AdamW weight decay")
    betas: tuple[float, float] = Field(default=(0.9, 0.99), description="AdamW betas")
    max_grad_norm: float = Field(default=1.0, gt=0.0, description="gradient clipping; a non-finite norm skips the step")
    warmup_steps: int = Field(default=0, ge=0, description="linear learning-rate warmup")
    optimizer: Literal["adamw", "muon"] = Field(
        default="adamw", description="adamw, or muon (Muon on 2-D hidden weight matrices, AdamW on the rest)"
    )
    muon_momentum: float = Field(default=0.95, ge=0.0, lt=1.0, description="Muon momentum")
    micro_batch_tokens: int = Field(
        default=4096, ge=64, description="tokens per forward/backward micro-batch (gradient accumulation above it)"
    )
    prefix_sharing: bool = Field(default=True, description="compute each group's shared prompt once")
    logits_chunk_tokens: int = Field(
        default=0,
        ge=0,
        description=(
            "> 0: compute log-probs and entropy through the output projection in chunks of this many tokens, "
            "recomputed in backward, so a micro-batch's full B x T x vocab logits are never held (0: off)"
        ),
    )
    gradient_checkpointing: bool = Field(
        default=False,
        description=(
            "activation checkpointing: keep only each decoder layer's input for backward and re-run the layer there "
            "(less memory for long or many sequences, about a third more train compute)"
        ),
    )
    precision: Literal["fp32", "bf16"] = Field(
        default="fp32",
        description=(
            "the log-prob passes' arithmetic: fp32, or bf16 (mixed precision: forward and backward under bf16 "
            "autocast, weights, gradients and optimizer state stay fp32, log-softmax in fp32). On a CPU with AVX-512 "
            "BF16 a forward and backward ran 1.7x faster alone, the RL update about 1.2x, and json-extract learned "
            "less over 3 seeds (docs/results/speed.md); slower where the CPU has no bf16 arithmetic. It makes "
            "algorithm.behavior_logprobs default to sampler and is_correction to truncate"
        ),
    )
    world_size: int = Field(
        default=1,
        ge=1,
        description="trainer processes (data parallel, gloo on CPU / NCCL on GPU); under torchrun its WORLD_SIZE wins",
    )
    dist_timeout_s: float = Field(
        default=600.0, gt=0.0, description="seconds a collective between trainer ranks may wait before the run fails"
    )
    sharding: Literal["none", "fsdp2"] = Field(
        default="none",
        description=(
            "with world_size > 1: none (every rank a full copy, gradients all-reduced) or fsdp2 (torch fully_shard per "
            "decoder layer: weights, gradients and optimizer state sharded over the ranks, a layer gathered while it "
            "computes; rank 0's sampler keeps its own full copy, refreshed by a gather at each sync; not with LoRA or "
            "Muon); "
            "with one rank there is nothing to shard"
        ),
    )


class WarmStartConfig(Strict):
    steps: int = Field(
        default=0,
        ge=0,
        description="supervised steps on the task's demonstrations before RL (0: off; needs a task with `demonstrate`)",
    )
    lr: float = Field(
        default=5e-5, gt=0.0, description="learning rate of the warm start (its own AdamW, dropped after)"
    )
    batch_size: int = Field(default=8, ge=1, description="demonstrations per warm-start step")
    demos: int = Field(
        default=0,
        ge=0,
        description=(
            "training rows turned into demonstrations, the first N (0: all); leave RL rows it has not seen: after a "
            "warm start on every row most groups can pass whole, and RL has little left "
            "to learn (docs/results/learning.md)"
        ),
    )
    eval: bool | None = Field(
        default=None,
        description=(
            "evaluate the warm-started model before RL (the run's 'before' eval, the base of its RL gain); null: as "
            "loop.eval_before, which otherwise governs only the base model's eval. loop.eval_before=false "
            "warm_start.eval=true skips the base model's eval alone"
        ),
    )
