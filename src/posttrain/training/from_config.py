"""A Trainer and the loss it is handed, from a Config: the trainer's settings, the loss's hyper-parameters, the
per-token weight function (importance-sampling correction x credit weights), and which self-distillation teacher
the run has. The run's stepper (loop/), trainer ranks (training/launch.py) and the preflight's probe step build
them through these, so every rank trains with the same settings."""

from __future__ import annotations

from typing import Any

from posttrain.algos import IS_CORRECTIONS, TOKEN_WEIGHTS, LossParams
from posttrain.config.schema import AlgorithmConfig, Config, RemediesConfig
from posttrain.training.trainer import TokenWeightFn, Trainer


def make_trainer(cfg: Config, model: Any, pad_id: int, cls: type = Trainer) -> Trainer:
    """`cls`: Trainer, or ShardedTrainer over an FSDP2-sharded model (training/launch.rank_trainer)."""
    t = cfg.trainer
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
        temperature=cfg.sampling.temperature,
        optimizer=t.optimizer,
        muon_momentum=t.muon_momentum,
        logits_chunk_tokens=t.logits_chunk_tokens,
        gradient_checkpointing=t.gradient_checkpointing,
        precision=t.precision,
        report_gap_max=cfg.sampling.engine != "own",
    )


def self_teacher(a: AlgorithmConfig, remedies: RemediesConfig | None = None) -> tuple[str, float] | None:
    """Which self-distillation teacher the run has (the config allows one): its metric prefix and coefficient.
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
    for name, on, coef in (
        ("hint", a.hint_distill.enabled, a.hint_distill.coef),
        ("insight", a.insights.enabled, a.insights.coef),
        ("rised", a.rised.enabled and a.rised.positive_distill, a.rised.coef),
        ("hint", guided, a.hint_distill.coef),
    ):
        if on:
            return name, coef
    return None


def run_remedies(cfg: Config) -> RemediesConfig | None:
    """The remedies config when the run watches itself (diagnostics on), else None."""
    return cfg.diagnostics.remedies if cfg.diagnostics.enabled else None


def loss_params(cfg: Config, max_tokens: int) -> LossParams:
    """The loss's hyper-parameters, once per run. With KL as a reward the loss has no KL term (beta 0 there)."""
    a = cfg.algorithm
    own = self_teacher(a, run_remedies(cfg))
    return LossParams(
        epsilon=a.epsilon,
        epsilon_high=a.epsilon_high,
        beta=a.beta if a.kl_mode == "loss" else 0.0,
        kl_estimator=a.kl_estimator,
        aggregation=a.aggregation,
        max_tokens=max_tokens,
        cispo_epsilon_low=a.cispo_epsilon_low,
        dual_clip=a.dual_clip,
        distill_coef=a.teacher.coef if a.teacher.model else own[1] if own else 0.0,
        rl_weight=a.teacher.rl_weight if a.teacher.model else 1.0,
        distill_prefix=own[0] if own else "teacher",
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
