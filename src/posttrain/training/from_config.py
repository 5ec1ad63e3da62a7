"""A Trainer and the loss it is handed: the trainer's settings (`trainer_setup`, read from the Config once), the
loss's hyper-parameters, the per-token weight function (importance-sampling correction x credit weights), and which
self-distillation teacher the run has. Rank 0 decides them from the Config (loop/step_plan.py, loop/wiring.py);
trainer ranks (training/launch.py) build the same Trainer and loss from the `RankPlan` rank 0 hands them, never
from the Config, so every rank trains with the settings rank 0 decided."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from posttrain.algos import IS_CORRECTIONS, LOSSES, TOKEN_WEIGHTS, LossParams
from posttrain.algos.loss_terms import with_terms
from posttrain.config.schema import AlgorithmConfig, Config, RemediesConfig
from posttrain.training.protocol import LossFn, TokenWeightFn
from posttrain.training.rank_plan import TrainerSetup
from posttrain.training.trainer import Trainer


def trainer_setup(cfg: Config) -> TrainerSetup:
    """What the run's Trainer is built from (the same on every rank)."""
    return TrainerSetup(
        trainer=cfg.trainer, temperature=cfg.sampling.temperature, report_gap_max=cfg.sampling.engine != "own"
    )


def make_trainer(setup: TrainerSetup, model: Any, pad_id: int, cls: type = Trainer) -> Trainer:
    """`cls`: Trainer, or ShardedTrainer over an FSDP2-sharded model (training/launch.rank_trainer)."""
    t = setup.trainer
    return cls(
        model,
        pad_id=pad_id,
        lr=t.lr,
        weight_decay=t.weight_decay,
        betas=tuple(t.betas),
        max_grad_norm=t.max_grad_norm,
        warmup_steps=t.warmup_steps,
        micro_batch_tokens=t.micro_batch_tokens,
        prefix_sharing=t.prefix_sharing,
        temperature=setup.temperature,
        optimizer=t.optimizer,
        muon_momentum=t.muon_momentum,
        logits_chunk_tokens=t.logits_chunk_tokens,
        gradient_checkpointing=t.gradient_checkpointing,
        precision=t.precision,
        report_gap_max=setup.report_gap_max,
    )


@dataclass(frozen=True)
class SelfTeacher:
    """The run's self-distillation teacher (the policy with a hint in its context, guidance/teacher.py):
    `kind` is the hint's source and its metrics' prefix ("hint": feedback or a remedy's format hint, "insight",
    "rised"), `coef` the distillation term's weight, `hint_cap` the most tokens a hint may take."""

    kind: str
    coef: float
    hint_cap: int


def self_teacher(a: AlgorithmConfig, remedies: RemediesConfig | None = None) -> SelfTeacher | None:
    """Which self-distillation teacher the run has (the config allows one), decided once per process.
    A remedy's guided format hint (`remedies`, when diagnostics are on) uses the hint teacher too."""
    # With a teacher model (algorithm.teacher.model) that model is the run's teacher: a remedy's hint adds none.
    guided = (
        remedies is not None
        and remedies.enabled
        and remedies.format_hint
        and remedies.format_hint_mode == "guide"
        and remedies.format_hint_distill
        and not a.teacher.model
    )
    # a feedback hint is capped by the config; insights fill up to per_task sentences; RISED lists behaviours
    for name, on, coef, cap in (
        ("hint", a.hint_distill.enabled, a.hint_distill.coef, a.hint_distill.max_hint_tokens),
        ("insight", a.insights.enabled, a.insights.coef, a.insights.per_task * a.insights.max_tokens + 16),
        ("rised", a.rised.enabled and a.rised.positive_distill, a.rised.coef, 256),
        ("hint", guided, a.hint_distill.coef, a.hint_distill.max_hint_tokens),
    ):
        if on:
            return SelfTeacher(name, coef, cap)
    return None


def run_remedies(cfg: Config) -> RemediesConfig | None:
    """The remedies config when the run watches itself (diagnostics on), else None."""
    return cfg.diagnostics.remedies if cfg.diagnostics.enabled else None


@dataclass(frozen=True)
class LossSetup:
    """The loss a trainer runs: the policy loss composed with its terms (algos/loss_terms.py), its
    hyper-parameters and the per-token weights. Every trainer rank builds the same one from the same two inputs."""

    loss_fn: LossFn
    params: LossParams
    token_weight_fn: TokenWeightFn | None

    @classmethod
    def build(cls, a: AlgorithmConfig, params: LossParams) -> LossSetup:
        """`a`: the loss's name, IS correction and credit weights. `params`: its hyper-parameters as rank 0 decided
        them (`loss_params`: the token budget and the teacher's weight included)."""
        return cls(with_terms(LOSSES[a.loss]), params, token_weight_fn(a))


def loss_params(cfg: Config, max_tokens: int, own: SelfTeacher | None) -> LossParams:
    """The loss's hyper-parameters, once per run. With KL as a reward the loss has no KL term (beta 0 there)."""
    a = cfg.algorithm
    return LossParams(
        epsilon=a.epsilon,
        epsilon_high=a.epsilon_high,
        beta=a.beta if a.kl_mode == "loss" else 0.0,
        kl_estimator=a.kl_estimator,
        aggregation=a.aggregation,
        max_tokens=max_tokens,
        cispo_epsilon_low=a.cispo_epsilon_low,
        dual_clip=a.dual_clip,
        distill_coef=a.teacher.coef if a.teacher.model else own.coef if own else 0.0,
        rl_weight=a.teacher.rl_weight if a.teacher.model else 1.0,
        distill_prefix=own.kind if own else "teacher",
    )


def token_weight_fn(a: AlgorithmConfig) -> TokenWeightFn | None:
    """Importance-sampling correction times credit weights, as one per-micro-batch function (None: neither)."""
    if a.is_correction == "none" and a.token_weighting == "none":
        return None
    correct = IS_CORRECTIONS[a.is_correction]
    credit = TOKEN_WEIGHTS[a.token_weighting] if a.token_weighting != "none" else None

    def fn(logp_BT, sampler_BT, entropy_BT, mask_BT):
        w_BT, m = correct(logp_BT, sampler_BT, mask_BT, cap=a.is_cap, level=a.is_level)
        metrics = {f"is/{k}": v for k, v in m.items()}
        if credit is not None:
            c_BT = credit(entropy_BT, mask_BT, frac=a.token_weighting_frac)
            metrics["credit/weighted_token_frac"] = float((c_BT > 0).sum() / mask_BT.sum().clamp(min=1))
            w_BT = c_BT if w_BT is None else w_BT * c_BT
        return w_BT, metrics

    return fn
