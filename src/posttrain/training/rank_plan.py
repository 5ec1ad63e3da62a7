"""`RankPlan`: everything a trainer rank needs, decided by rank 0 once and handed to every rank as one file.

A rank builds the same model and Trainer as rank 0 and runs the loss rank 0 decided; it never loads the task (the
token budget comes in the loss's parameters) and never decides the self-distillation teacher again (its weight is
in the same parameters). Rank 0 sends the plan as JSON over the process group once every rank has joined it
(training/launch.py), the same way whether rank 0 started the ranks or torchrun did.
"""

from __future__ import annotations

from dataclasses import asdict

from pydantic import BaseModel, ConfigDict

from posttrain.algos.losses import LossParams
from posttrain.config.algorithm import AlgorithmConfig
from posttrain.config.model import LoraConfig, ModelConfig
from posttrain.config.trainer import TrainerConfig


class TrainerSetup(BaseModel):
    """What a Trainer is built from: the trainer section, the temperature its log-probs are scored at, and whether
    it reports the sampler/trainer log-prob gap in full (an engine other than the own sampler)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    trainer: TrainerConfig
    temperature: float | None
    report_gap_max: bool


class RankPlan(BaseModel):
    """`model`, `lora`, `seed`: the same policy as rank 0. `setup`: the same Trainer. `algorithm` + `loss_params`:
    the loss rank 0's stepper runs (loss name, IS correction and credit weights from `algorithm`; the
    hyper-parameters, the token budget and the teacher's weight, already decided, in `loss_params`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: ModelConfig
    lora: LoraConfig
    seed: int
    setup: TrainerSetup
    algorithm: AlgorithmConfig
    loss_params: dict[str, object]

    @classmethod
    def of(
        cls,
        model: ModelConfig,
        lora: LoraConfig,
        seed: int,
        setup: TrainerSetup,
        algorithm: AlgorithmConfig,
        params: LossParams,
    ) -> RankPlan:
        return cls(model=model, lora=lora, seed=seed, setup=setup, algorithm=algorithm, loss_params=asdict(params))

    def params(self) -> LossParams:
        return LossParams(**self.loss_params)  # pyright: ignore[reportArgumentType] - written from asdict(LossParams)
