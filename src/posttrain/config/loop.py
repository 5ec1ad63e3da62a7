"""The `loop:` section: steps, evaluation, checkpoints, the async loop, and how each step's prompts are picked
(`loop.selection:`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from posttrain.config.strict import Strict

# Completions per held-out prompt at most (loop.eval_samples, eval_suite.samples, `posttrain eval --samples`): pass@k
# past k = 1024 says nothing pass@1024 does not, and an eval holds every trajectory until it scores them (48 prompts x
# 1024 = 49k). A million was accepted, and ran out of memory building its rollouts.
MAX_EVAL_SAMPLES = 1024


class SelectionConfig(Strict):
    replay_share: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description=(
            "adaptive: share of each step's prompts replayed from the learnable ones (seen, not all passed, not "
            "hopeless), least recently seen first; the rest are fresh prompts in the run's seeded order"
        ),
    )
    retire_after: int = Field(
        default=1,
        ge=1,
        le=8,
        description=("adaptive: a prompt whose last N groups all passed is retired (drawn again only as a revisit)"),
    )
    backoff_after: int = Field(
        default=2,
        ge=1,
        le=8,
        description=(
            "adaptive: a prompt whose last N groups had no pass and no reward spread is backed off until a remedy "
            "changes how rollouts are sampled (or a revisit)"
        ),
    )
    revisit_every: int = Field(
        default=20,
        ge=1,
        description=(
            "adaptive: a retired or backed-off prompt is drawn again at most once per this many steps, so forgetting "
            "or a late first pass shows"
        ),
    )
    revisit_slots: int = Field(default=1, ge=0, description="adaptive: prompts per step given to revisits at most")


class LoopConfig(Strict):
    steps: int = Field(default=60, ge=0, description="optimizer steps (each on a fresh batch of rollouts)")
    prompts_per_step: int = Field(default=4, ge=1, description="prompts per step; completions per step = this x G")
    num_iterations: int = Field(default=1, ge=1, description="optimizer passes over each batch")
    eval_every: int = Field(default=0, ge=0, description="held-out eval every N steps (0: only before and after)")
    eval_prompts: int = Field(default=48, ge=1, description="held-out prompts per evaluation")
    eval_before: bool = Field(
        default=True, description="evaluate before training (skip it when comparing many runs of one model)"
    )
    eval_samples: int = Field(
        default=1,
        ge=1,
        le=MAX_EVAL_SAMPLES,
        description=(
            "completions per held-out prompt (at most 1024); > 1 needs sampling.eval_temperature > 0 "
            "(pass_rate is then sampled pass@1)"
        ),
    )
    time_budget_s: float | None = Field(
        default=None, gt=0.0, description="stop after the step that uses up this much training time"
    )
    save_every: int = Field(default=10, ge=0, description="checkpoint every N steps (0: only at the end)")
    keep_checkpoints: int = Field(
        default=2,
        ge=0,
        description=(
            "checkpoints kept on disk (oldest removed); 0: never write one (no resume; final/ is still exported)"
        ),
    )
    samples_per_step: int = Field(default=2, ge=0, description="rollouts per step written to samples.jsonl")
    final_model: Literal["best", "last"] = Field(
        default="best",
        description=(
            "what final/ holds: the model of the held-out eval with the best loop.best_metric (ties go to the later "
            "step; RUN_DIR/best/ keeps it as the run goes), or the last step's; the run says which step final/ is"
        ),
    )
    best_metric: str = Field(
        default="eval/pass_rate",
        description=(
            "the held-out metric (higher is better) that picks the best model, e.g. eval/pass_rate, eval/reward/mean, "
            "eval/pass/<component>"
        ),
    )
    mode: Literal["sync", "async"] = Field(
        default="sync", description="async: rollout workers fill a queue while the trainer trains"
    )
    max_staleness: int = Field(
        default=1, ge=0, description="async: policy versions a trained token may lag behind (admission control)"
    )
    interruptible: bool = Field(
        default=True,
        description=(
            "async: a weight sync lands between two decode steps of a generation in flight instead of waiting for it "
            "to end; each token records the policy version it was sampled under (AReaL's interruptible generation)"
        ),
    )
    rollout_workers: int | None = Field(
        default=None,
        ge=1,
        description="async: groups in flight at most; default prompts_per_step x (max_staleness + 1)",
    )
    batch_timeout_s: float = Field(
        default=3600.0,
        gt=0.0,
        description="async: seconds the trainer waits for a step's groups before failing the run",
    )
    prompt_selection: str = Field(
        default="uniform",
        description=(
            "how each step's prompts are drawn (algos/prompt_selection.py): uniform (epochs over a seeded shuffle) or "
            "adaptive (replay prompts the policy sometimes fails, retire mastered ones, back off ones nothing passes; "
            "loop.selection.*). With algorithm.rised.selection on, RISED picks instead (the run's start line says so)"
        ),
    )
    selection: SelectionConfig = Field(default_factory=SelectionConfig)

    @field_validator("prompt_selection")
    @classmethod
    def _known_selection(cls, v: str) -> str:
        from posttrain.algos.prompt_selection import SELECTIONS

        if v not in SELECTIONS:  # the registry's message names the nearest known one
            try:
                SELECTIONS[v]
            except KeyError as e:
                raise ValueError(str(e)) from None
        return v
