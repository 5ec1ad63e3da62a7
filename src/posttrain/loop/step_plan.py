"""`StepPlan`: everything a policy-gradient step decides from the config, decided once (loop/wiring.py builds it)
and handed to the stepper, which then reads no config: the loss the trainer runs, how a batch is assembled, which
hint a self-distillation teacher reads, the ratio's old policy, how many optimizer passes, how many rows the report
keeps, where model work runs. `CollectPlan` is the same for the step's collector.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from posttrain.config.schema import Config
from posttrain.loop.batch import BatchOptions, HintFn, env_hint, feedback_hint, first_hint, remedy_hint
from posttrain.training.from_config import LossSetup, SelfTeacher, loss_params, run_remedies, self_teacher


@dataclass(frozen=True)
class CollectPlan:
    """What a collector does each step, decided once from the config (loop/wiring.py) so collectors read no config:
    how many prompts a step trains on, the run's seed (row order, refills), dynamic sampling's refills, whether the
    soft overlong penalty is on; for the async loop, how many steps there are, how stale a rollout may be, how many
    rollout workers run, and how long a step may wait for its batch."""

    prompts_per_step: int
    seed: int
    dynamic_sampling: bool = False
    max_refill_rounds: int = 0
    overlong_penalty: bool = False  # algorithm.overlong_buffer_frac > 0: the step reports the penalty's mean
    steps: int = 0  # async: the workers stop producing after the last step's groups
    max_staleness: int = 0
    rollout_workers: int = 0  # 0: prompts_per_step x (max_staleness + 1)
    batch_timeout_s: float = 0.0

    @classmethod
    def from_config(cls, cfg: Config) -> CollectPlan:
        a, loop = cfg.algorithm, cfg.loop
        return cls(
            prompts_per_step=loop.prompts_per_step,
            seed=cfg.run.seed,
            dynamic_sampling=a.dynamic_sampling,
            max_refill_rounds=a.max_refill_rounds,
            overlong_penalty=a.overlong_buffer_frac > 0,
            steps=loop.steps,
            max_staleness=loop.max_staleness,
            rollout_workers=loop.rollout_workers or loop.prompts_per_step * (loop.max_staleness + 1),
            batch_timeout_s=loop.batch_timeout_s,
        )


@dataclass(frozen=True)
class StepPlan:
    loss: LossSetup
    batch_options: BatchOptions
    # The self-distillation teacher (None: none, or a teacher model) and the hint its sequences carry.
    self_teacher: SelfTeacher | None
    hint_fn: HintFn | None
    kl_to_reference: bool  # algorithm.beta > 0: every sequence needs the reference's log-probs
    behaviour_from_sampler: bool  # the PPO ratio's old policy: the sampler's log-probs (else the trainer's)
    num_iterations: int
    samples_per_step: int  # rows samples.jsonl keeps per step (their per-token data is measured)
    off_event_loop: bool  # async mode: model work runs in a thread, so rollout workers keep generating
    base_temperature: float  # the sampling temperature a remedy's override falls back to

    @classmethod
    def from_config(cls, cfg: Config, max_tokens: int) -> StepPlan:
        """`max_tokens`: the completion budget (the loss's length normalizer)."""
        a = cfg.algorithm
        own = self_teacher(a, run_remedies(cfg))
        return cls(
            loss=LossSetup.build(a, loss_params(cfg, max_tokens, own)),
            batch_options=BatchOptions.from_config(a),
            self_teacher=None if a.teacher.model else own,
            hint_fn=_hint_fn(cfg, own),
            kl_to_reference=a.beta > 0,
            behaviour_from_sampler=a.behavior_logprobs == "sampler",
            num_iterations=cfg.loop.num_iterations,
            samples_per_step=cfg.loop.samples_per_step,
            off_event_loop=cfg.loop.mode == "async",
            base_temperature=cfg.sampling.temperature or 1.0,
        )


def _hint_fn(cfg: Config, own: SelfTeacher | None) -> HintFn | None:
    """What a self-hint teacher reads: a remedy's format hint or the sample's own feedback (hint_distill), else
    the hint its env wrote (insights, RISED)."""
    if own is None:
        return None
    if own.kind != "hint":
        return env_hint
    hd = cfg.algorithm.hint_distill
    feedback = partial(feedback_hint, template=hd.template) if hd.enabled else None
    return first_hint(partial(remedy_hint, template=hd.template), feedback)
