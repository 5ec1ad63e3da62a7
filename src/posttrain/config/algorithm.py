"""The `algorithm:` section: the estimator, loss and their knobs, the presets, and the teachers and methods that
learn from words (hint distillation, RLTL;DR insights, RISED). Importable without torch; re-exported by schema.py.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from posttrain.config.strict import Strict

# Presets: `algorithm.name` fills in every field the user did not set, so `algorithm.name=dapo` is DAPO and
# `algorithm.name=dapo algorithm.epsilon_high=0.3` is DAPO with a wider upper clip. Values the user sets win.
ALGORITHM_PRESETS: dict[str, dict] = {
    "grpo": {},
    "dr_grpo": {"advantage": "dr_grpo", "aggregation": "seq-mean-token-sum-norm"},
    "rloo": {"advantage": "rloo"},
    "reinforce_pp": {"advantage": "reinforce_pp"},
    "cispo": {"loss": "cispo", "epsilon_high": 4.0},
    "gspo": {"loss": "gspo", "epsilon": 3e-4, "epsilon_high": 4e-4},
    "dapo": {
        "epsilon_high": 0.28,
        "aggregation": "token-mean",
        "dynamic_sampling": True,
        "overlong_filter": False,
        "overlong_buffer_frac": 0.2,
    },
    "es": {"stepper": "es"},
}


class ESConfig(Strict):
    population: int = Field(
        default=8, ge=2, description="perturbed models per iteration (antithetic pairs: population/2 seeds)"
    )
    sigma: float = Field(default=1e-3, gt=0.0, description="noise scale of each perturbation")
    lr: float = Field(
        default=5e-4,
        gt=0.0,
        description="step: theta += lr / population * sum of rank-weighted noise (Qiu et al. 2025)",
    )
    samples_per_prompt: int = Field(default=1, ge=1, description="completions per prompt when scoring one perturbation")
    temperature: float = Field(
        default=0.0,
        ge=0.0,
        allow_inf_nan=False,
        description="sampling temperature for fitness (0: greedy, as Qiu et al. 2025)",
    )


class TeacherConfig(Strict):
    model: str | None = Field(
        default=None,
        description=(
            "on-policy distillation teacher: 'default', a HF folder (e.g. a run's final/) or 'tiny-random'; null: off. "
            "It must share the policy's tokenizer"
        ),
    )
    coef: float = Field(default=1.0, ge=0.0, description="weight of the per-token reverse-KL term toward the teacher")
    rl_weight: float = Field(
        default=1.0, ge=0.0, description="weight of the task's RL term beside it (0: pure distillation)"
    )


class HintDistillConfig(Strict):
    enabled: bool = Field(
        default=False,
        description=(
            "hint-conditioned self-distillation: for a sample with feedback (a failing check, a tool error), the "
            "policy itself with the feedback as a hint at that turn is the teacher of a per-token reverse-KL term"
        ),
    )
    coef: float = Field(default=1.0, ge=0.0, description="weight of the reverse-KL term toward the hinted policy")
    template: str = Field(
        default="\n\nHint: {hint}",
        description="how the hint is written into the teacher's context ({hint}: the feedback)",
    )
    max_hint_tokens: int = Field(default=64, ge=1, description="a longer hint is cut to this many tokens")

    @field_validator("template")
    @classmethod
    def _has_slot(cls, v: str) -> str:
        if "{hint}" not in v:
            raise ValueError("hint_distill.template must contain '{hint}' (where the feedback goes)")
        return v


class InsightsConfig(Strict):
    enabled: bool = Field(
        default=False,
        description=(
            "RLTL;DR: after a failed attempt the policy writes a one-sentence insight; later rollouts of that task "
            "read the task's insights, and unconditioned rollouts learn toward the "
            "insight-conditioned policy (docs/feedback.md)"
        ),
    )
    per_task: int = Field(default=3, ge=1, description="insights kept per task row (the newest)")
    max_tasks: int = Field(
        default=10_000, ge=1, description="task rows with insights kept (least recently written dropped)"
    )
    unconditioned_share: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description=(
            "share of rollouts of a task with insights that do not see them (they get the internalisation term)"
        ),
    )
    per_group: int = Field(default=1, ge=1, description="insights written per prompt per step, from its failed samples")
    coef: float = Field(
        default=1.0,
        ge=0.0,
        description="weight of the internalisation term (reverse KL toward the policy with the insights)",
    )
    max_tokens: int = Field(default=48, ge=4, description="an insight's length limit in tokens")
    temperature: float = Field(
        default=0.7, ge=0.0, allow_inf_nan=False, description="sampling temperature when writing an insight"
    )


class RisedConfig(Strict):
    enabled: bool = Field(
        default=False,
        description=(
            "RISED: tag every rollout with behaviours from a rubric vocabulary; log each tag's share per step; use the "
            "profiles for prompt selection, positive-rubric self-distillation and "
            "negative-rubric steering (docs/feedback.md)"
        ),
    )
    vocabulary: str | None = Field(
        default=None,
        description="a YAML tag vocabulary (tags: [{name, polarity, description, rule?}]); null: the built-in one",
    )
    judge_model: str = Field(
        default="default",
        description="the local judge for tags without a rule ('default', a HF folder or 'tiny-random')",
    )
    selection: bool = Field(
        default=True,
        description=(
            "profile-based prompt selection: match the last batch's behaviour mix, no repeats within the window"
        ),
    )
    candidates: int = Field(default=4, ge=1, description="selection: candidate prompts per selected prompt")
    window: int = Field(
        default=4, ge=0, description="selection: steps during which a selected prompt is not selected again"
    )
    negative: Literal["penalty", "hint", "off"] = Field(
        default="penalty",
        description=(
            "negative tags: a reward penalty (once per sample with any), a 'Avoid: ...' line in the prompts of rows "
            "where they recur, or nothing"
        ),
    )
    penalty: float = Field(
        default=0.1, ge=0.0, description="negative='penalty': reward subtracted from a sample with any negative tag"
    )
    positive_distill: bool = Field(
        default=True,
        description=(
            "a rollout missing a positive behaviour is distilled toward the policy told to show it ('Make sure: ...')"
        ),
    )
    coef: float = Field(default=1.0, ge=0.0, description="weight of the positive-rubric distillation term")


class AlgorithmConfig(Strict):
    name: str = Field(
        default="grpo", description=f"preset: {', '.join(ALGORITHM_PRESETS)} (fills fields you did not set)"
    )
    stepper: Literal["policy_gradient", "es"] = Field(
        default="policy_gradient",
        description=(
            "how a step trains: policy_gradient (a Trainer), or es (evolution strategies); the es preset sets it"
        ),
    )
    advantage: str = Field(default="grpo", description="advantage estimator, by registry name")
    scale_std: bool = Field(default=True, description="divide group-centred rewards by the group std")
    loss: str = Field(default="ppo_clip", description="policy loss, by registry name")
    num_generations: int = Field(default=4, ge=2, description="G: completions per prompt")
    epsilon: float = Field(default=0.2, gt=0.0)
    epsilon_high: float | None = Field(
        default=None, gt=0.0, description="upper clip (DAPO clip-higher); default: epsilon"
    )
    dual_clip: float | None = Field(
        default=None, gt=1.0, description="ppo_clip dual-clip constant c (e.g. 3); null: off"
    )
    cispo_epsilon_low: float | None = Field(
        default=None, ge=0.0, description="CISPO: lower IS-weight bound 1 - this; null: none"
    )
    beta: float = Field(default=0.0, ge=0.0, description="KL-to-reference coefficient; 0 loads no reference model")
    behavior_logprobs: Literal["policy", "sampler", "trainer"] = Field(
        default="policy",
        description=(
            "the PPO ratio's old policy: policy (the current policy's own log-probs, detached; with num_iterations > 1 "
            "the policy before this step's updates, recomputed) or sampler (the log-probs the sampler returned); the "
            "same in sync and async mode. 'trainer' is policy's old name and means the same"
        ),
    )
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    kl_mode: Literal["loss", "reward"] = Field(
        default="loss", description="KL as a loss term or as a per-sequence reward penalty"
    )
    aggregation: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = "token-mean"
    is_correction: Literal["none", "truncate", "mask"] = Field(
        default="none", description="sampler-vs-trainer importance sampling: truncate (TIS) or mask tokens past is_cap"
    )
    is_level: Literal["token", "sequence"] = Field(
        default="token", description="importance ratio per token or per sequence"
    )
    is_cap: float = Field(
        default=2.0, ge=1.0, description="TIS cap on the ratio; mask mode keeps 1/cap <= ratio <= cap"
    )
    token_weighting: str = Field(
        default="none", description="per-token credit weights, by registry name (none, high_entropy)"
    )
    token_weighting_frac: float = Field(
        default=0.2, gt=0.0, le=1.0, description="high_entropy: fraction of tokens trained on"
    )
    dynamic_sampling: bool = Field(
        default=False, description="DAPO: replace zero-variance groups by sampling more prompts"
    )
    max_refill_rounds: int = Field(
        default=3, ge=0, description="dynamic sampling: extra sampling rounds per step at most"
    )
    overlong_filter: bool = Field(default=False, description="DAPO: truncated completions get no loss")
    overlong_buffer_frac: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description=(
            "DAPO soft overlong penalty over the last fraction of max_tokens (DAPO: 4096 of 20480 = 0.2; 0: off)"
        ),
    )
    overlong_penalty: float = Field(default=1.0, ge=0.0, description="soft overlong penalty at the token limit")
    es: ESConfig = ESConfig()
    teacher: TeacherConfig = TeacherConfig()
    hint_distill: HintDistillConfig = HintDistillConfig()
    insights: InsightsConfig = InsightsConfig()
    rised: RisedConfig = RisedConfig()

    @model_validator(mode="before")
    @classmethod
    def _preset(cls, data):
        if isinstance(data, dict) and data.get("name", "grpo") in ALGORITHM_PRESETS:
            return {**ALGORITHM_PRESETS[data.get("name", "grpo")], **data}
        return data

    @model_validator(mode="after")
    def _known_name(self) -> AlgorithmConfig:
        if self.name not in ALGORITHM_PRESETS:
            import difflib

            near = difflib.get_close_matches(self.name, list(ALGORITHM_PRESETS), n=1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            raise ValueError(f"unknown algorithm.name {self.name!r}{hint} (known: {', '.join(ALGORITHM_PRESETS)})")
        self_teachers = [
            n
            for n, on in (
                ("hint_distill", self.hint_distill.enabled),
                ("insights", self.insights.enabled),
                ("rised", self.rised.enabled and self.rised.positive_distill),
            )
            if on
        ]
        if len(self_teachers) > 1:
            raise ValueError(
                f"algorithm.{' and algorithm.'.join(self_teachers)} are on: each distills toward the policy "
                "with its own hint; turn on one per run (rised.positive_distill=false keeps RISED's other parts)"
            )
        if self.teacher.model and self_teachers:
            raise ValueError(
                "algorithm.teacher.model and algorithm.hint_distill/insights both set: one distillation "
                "teacher per run (a model, or the policy with a hint)"
            )
        return self
