"""The `diagnostics:` section: which stalls a run watches for, and the remedies it applies (obs/diagnostics.py,
obs/remedies.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from posttrain.config.strict import Strict


class RemediesConfig(Strict):
    enabled: bool = Field(
        default=True,
        description=(
            "apply remedies when a diagnostic fires (each logged and marked in the report); never changes the reward. "
            "On by default: bench/defaults.py measured no held-out loss on the demo and custom_task and 0% -> 55-100% "
            "on a stalled task"
        ),
    )
    temperature_max: float = Field(
        default=1.2, gt=0.0, allow_inf_nan=False, description="no signal: raise the sampling temperature up to this"
    )
    temperature_step: float = Field(
        default=0.15, gt=0.0, allow_inf_nan=False, description="no signal: temperature added per stalled step"
    )
    num_generations_max: int = Field(default=8, ge=2, description="no signal: double G for stalled prompts up to this")
    decay: float = Field(
        default=0.5, ge=0.0, lt=1.0, description="once groups have variance again, the share of the boost kept per step"
    )
    format_hint: bool = Field(
        default=True,
        description="no signal: append the row's `format_hint` column (when the task has one) to stalled prompts",
    )
    format_hint_after: int = Field(default=1, ge=0, description="stalled steps before the format hint is used")
    format_hint_mode: Literal["guide", "prompt"] = Field(
        default="guide",
        description="guide: sample stalled prompts with the hint, train on them as if the prompt had no hint "
        "(the policy learns to answer that way unprompted); prompt: train on the hinted prompt as sampled",
    )
    format_hint_distill: bool = Field(
        default=True,
        description="guide mode: the policy reading the hint is also the teacher "
        "(per-token reverse KL, with algorithm.hint_distill's coef and template) of the "
        "stalled samples that did not pass",
    )
    guide_share: float = Field(
        default=0.5,
        gt=0.0,
        le=1.0,
        description="guide mode: share of a stalled prompt's samples "
        "drawn with the hint (the rest without, so the pass rate of those says when the policy "
        "has learned it)",
    )
    no_pass_steps: int = Field(
        default=3,
        ge=0,
        description="a stall also starts after this many steps in a row with no "
        "passing sample, before a diagnostic fires (0: only the diagnostics)",
    )
    entropy: Literal["off", "bonus", "lr"] = Field(
        default="lr", description="entropy collapse: an entropy bonus in the loss, or a lower learning rate"
    )
    entropy_bonus: float = Field(default=0.01, ge=0.0, description="entropy coefficient of the bonus remedy")
    lr_scale: float = Field(
        default=0.5, gt=0.0, le=1.0, description="learning-rate multiplier of the lr remedy (and after a skipped step)"
    )
    overlong_buffer_frac: float = Field(
        default=0.2, ge=0.0, le=1.0, description="runaway length: the soft overlong penalty switched on (0: off)"
    )
    stop: list[str] = Field(
        default_factory=list, description="runaway length or truncation: stop strings added to sampling"
    )


class DiagnosticsConfig(Strict):
    enabled: bool = Field(
        default=True, description="watch each step's metrics for a stalled or broken run (posttrain diagnose)"
    )
    patience: int = Field(default=3, ge=1, description="steps a condition must hold before it is reported")
    clear_after: int = Field(
        default=5, ge=1, description="steps a condition must be gone before it is reported cleared"
    )
    failed_frac: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description="failing samples: share of samples whose rollout or reward raised (over patience steps)",
    )
    zero_variance_frac: float = Field(
        default=0.75,
        ge=0.0,
        le=1.0,
        description="no signal: share of groups whose G rewards were all equal (mean over patience steps)",
    )
    saturated_pass_rate: float = Field(
        default=0.95, ge=0.0, le=1.0, description="saturated: train headline pass rate at or above this"
    )
    plateau_window: int = Field(
        default=5,
        ge=2,
        description=(
            "plateau: steps over which the reward's trend is measured (the pass must not have fired in 2x this)"
        ),
    )
    plateau_min_gain: float = Field(
        default=0.05, ge=0.0, description="plateau: least reward gain over the window (fitted trend)"
    )
    entropy_floor: float = Field(
        default=0.01, ge=0.0, description="entropy collapse: per-token entropy (nats) below this ..."
    )
    entropy_drop_frac: float = Field(
        default=0.05,
        ge=0.0,
        le=1.0,
        description=(
            "... or below this share of its first steps' mean, with half the groups or more without reward variance"
        ),
    )
    entropy_rise_factor: float = Field(
        default=3.0, gt=1.0, description="blow-up: entropy above this multiple of its first steps' mean"
    )
    truncated_frac: float = Field(
        default=0.5, ge=0.0, le=1.0, description="truncation: share of completions cut at the token limit"
    )
    length_growth: float = Field(
        default=2.0, gt=1.0, description="runaway length: mean length this multiple of its first steps' mean"
    )
    sampler_kl_max: float = Field(
        default=0.05, ge=0.0, description="off-policy: sampler-vs-trainer KL (k3, per token) above this"
    )
    is_ratio_max: float = Field(default=10.0, gt=1.0, description="off-policy: importance ratio above this")
    heldout_drop: float = Field(
        default=0.05,
        ge=0.0,
        description="over-fitting: held-out pass rate this far below its best while train reward rose",
    )
    memory_headroom_mb: float = Field(
        default=1536.0,
        ge=0.0,
        description=(
            "memory pressure: memory left on the machine (or cgroup) at this run's peak below this, or below the last "
            "step's growth of the peak"
        ),
    )
    remedies: RemediesConfig = RemediesConfig()
