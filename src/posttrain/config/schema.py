"""Every setting of a run, as pydantic models. Importable without torch.

Each model forbids unknown keys, so a typo is an error that names the nearest valid key (see load.py).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class RunConfig(_Strict):
    name: str | None = Field(None, description="run name; default: <task>-<timestamp>")
    output_dir: str = Field("runs", description="parent folder of run directories")
    seed: int = 0


class ModelConfig(_Strict):
    name: str = Field("default", description="'default' (SmolLM2-135M-Instruct), 'tiny-random', a local HF folder, or a hub id")
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    threads: int | None = Field(None, ge=1, description="torch threads; default: all cores")
    attn_implementation: str = "sdpa"


class LoraConfig(_Strict):
    enabled: bool = False
    r: int = Field(16, ge=1)
    alpha: float = 32.0
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    target_modules: list[str] = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class TaskConfig(_Strict):
    name: str = Field("json-extract", description="a built-in task name, 'path/file.py:make_task' or 'pkg.module:make_task'")
    options: dict = Field(default_factory=dict, description="keyword arguments for the task factory")


class SamplingConfig(_Strict):
    max_tokens: int | None = Field(None, ge=1, description="new tokens per completion; default: the task's")
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0)
    stop: list[str] = []
    eval_temperature: float = Field(0.0, ge=0.0, description="0 = greedy held-out eval")


class AlgorithmConfig(_Strict):
    advantage: str = Field("grpo", description="advantage estimator, by registry name")
    scale_std: bool = Field(True, description="divide group-centred rewards by the group std")
    loss: str = Field("ppo_clip", description="policy loss, by registry name")
    num_generations: int = Field(4, ge=2, description="G: completions per prompt")
    epsilon: float = Field(0.2, gt=0.0)
    epsilon_high: float | None = Field(None, gt=0.0, description="upper clip (DAPO clip-higher); default: epsilon")
    beta: float = Field(0.0, ge=0.0, description="KL-to-reference coefficient; 0 loads no reference model")
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    aggregation: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = "token-mean"


class TrainerConfig(_Strict):
    lr: float = Field(1e-5, gt=0.0)
    weight_decay: float = Field(0.0, ge=0.0)
    betas: tuple[float, float] = (0.9, 0.99)
    max_grad_norm: float = Field(1.0, gt=0.0)
    warmup_steps: int = Field(0, ge=0)
    optimizer: Literal["adamw"] = "adamw"
    micro_batch_tokens: int = Field(4096, ge=64, description="tokens per forward/backward micro-batch (gradient accumulation above it)")
    prefix_sharing: bool = Field(True, description="compute each group's shared prompt once")


class LoopConfig(_Strict):
    steps: int = Field(40, ge=0)
    prompts_per_step: int = Field(4, ge=1)
    num_iterations: int = Field(1, ge=1, description="optimizer passes over each batch")
    eval_every: int = Field(0, ge=0, description="held-out eval every N steps (0: only before and after)")
    eval_prompts: int = Field(48, ge=1)
    save_every: int = Field(10, ge=0, description="checkpoint every N steps (0: only at the end)")
    keep_checkpoints: int = Field(2, ge=1)
    samples_per_step: int = Field(2, ge=0, description="rollouts per step written to samples.jsonl")


class LoggingConfig(_Strict):
    tensorboard: bool = True
    console: bool = True


class Config(_Strict):
    run: RunConfig = RunConfig()
    model: ModelConfig = ModelConfig()
    lora: LoraConfig = LoraConfig()
    task: TaskConfig = TaskConfig()
    sampling: SamplingConfig = SamplingConfig()
    algorithm: AlgorithmConfig = AlgorithmConfig()
    trainer: TrainerConfig = TrainerConfig()
    loop: LoopConfig = LoopConfig()
    logging: LoggingConfig = LoggingConfig()

    @model_validator(mode="after")
    def _check(self) -> "Config":
        if self.algorithm.epsilon_high is not None and self.algorithm.epsilon_high < self.algorithm.epsilon:
            raise ValueError(f"algorithm.epsilon_high ({self.algorithm.epsilon_high}) must be >= algorithm.epsilon "
                             f"({self.algorithm.epsilon})")
        return self
