"""The one place that picks how a run steps: a registry of stepper factories, keyed by `algorithm.stepper`.

    policy_gradient   Trainer + Collector (loop.mode: sync, or async with staleness admission) + WeightSync
    es                evolution strategies: perturbed copies scored by the env, no Trainer

A factory gets the config, the run's components (loop/builder.py) and the run directory, and returns a Stepper
(loop/run.py). Adding a schedule is a function registered here.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

from posttrain.algos.registry import Registry
from posttrain.config.schema import Config
from posttrain.loop.async_collect import AsyncCollector, MeteredSampler
from posttrain.loop.builder import Components, resolve_dtype
from posttrain.loop.collect import Rollouts, SyncCollector
from posttrain.loop.es_stepper import ESStepper
from posttrain.loop.pg_stepper import PolicyGradientStepper
from posttrain.loop.teacher import SelfHintTeacher, load_teacher
from posttrain.loop.weight_sync import CopyWeights, LowPrecisionCopy, SharedWeights
from posttrain.models.load import stop_token_ids
from posttrain.obs.timers import BusyMeter
from posttrain.sampling.hf_sampler import HFSampler
from posttrain.sampling.precision import low_precision_copy
from posttrain.train.launch import start_ranks, world_size
from posttrain.train.trainer import Trainer

STEPPERS: Registry = Registry("stepper")
COLLECTORS: Registry = Registry("loop mode")


def pass_thresholds(c: Components) -> dict[str, float]:
    return {x.name: x.pass_threshold for x in c.task.rubric.components}


def rollout_sampler(cfg: Config, c: Components, own_copy: bool) -> tuple[HFSampler, Any]:
    """The sampler rollouts use and the WeightSync that keeps it current: the policy's own sampler (a version
    bump), a full-precision copy (the async loop: training and generation overlap), or a low-precision copy
    (sampling.precision), refreshed at each sync."""
    p = cfg.sampling.precision
    if p == "fp32" and not own_copy:
        return c.sampler, SharedWeights(c.sampler)
    model = low_precision_copy(c.model, p) if p != "fp32" else copy.deepcopy(c.model).eval()
    sampler = HFSampler(model, c.tokenizer, stop_token_ids(c.model, c.tokenizer), seed=cfg.run.seed)
    sampler.generator.set_state(c.sampler.generator.get_state())
    sampler.policy_version = c.sampler.policy_version
    return sampler, (LowPrecisionCopy(c.model, sampler, p) if p != "fp32" else CopyWeights(c.model, sampler))


@COLLECTORS.register("sync")
def sync_collector(cfg: Config, c: Components) -> tuple[Any, Any]:
    """Roll out now, when the step asks."""
    sampler, sync = rollout_sampler(cfg, c, own_copy=False)
    rollouts = Rollouts.from_config(cfg, c.env, sampler, c.task.train_rows, c.train_params)
    return SyncCollector(cfg, rollouts), sync


@COLLECTORS.register("async")
def async_collector(cfg: Config, c: Components) -> tuple[Any, Any]:
    """Rollout workers run ahead with a sampler that holds its own copy of the model, so training and generation
    overlap; each sync copies the weights in."""
    sampler, sync = rollout_sampler(cfg, c, own_copy=True)
    meters = {k: BusyMeter() for k in ("model_call", "rollout")}
    rollouts = Rollouts.from_config(cfg, c.env, MeteredSampler(sampler, meters["model_call"]), c.task.train_rows,
                                    c.train_params)
    return AsyncCollector(cfg, rollouts, meters), sync


def make_trainer(cfg: Config, model: Any, pad_id: int) -> Trainer:
    t = cfg.trainer
    return Trainer(model, pad_id=pad_id, lr=t.lr, weight_decay=t.weight_decay, betas=tuple(t.betas),
                   max_grad_norm=t.max_grad_norm, warmup_steps=t.warmup_steps, micro_batch_tokens=t.micro_batch_tokens,
                   prefix_sharing=t.prefix_sharing, temperature=cfg.sampling.temperature, optimizer=t.optimizer,
                   muon_momentum=t.muon_momentum, logits_chunk_tokens=t.logits_chunk_tokens)


@STEPPERS.register("policy_gradient")
def policy_gradient(cfg: Config, c: Components, run_dir: Path, say: Callable[[str], None]) -> PolicyGradientStepper:
    trainer = make_trainer(cfg, c.model, c.tokenizer.pad_token_id)
    if world_size(cfg) > 1:  # data parallel over trainer ranks (train/distributed.py); rank 0 runs this loop
        say(f"trainer: {world_size(cfg)} ranks, data parallel")
        trainer = start_ranks(cfg, trainer, run_dir / "config.yaml")
    collector, sync = COLLECTORS[cfg.loop.mode](cfg, c)
    lora_ref = c.model.disable_adapter if cfg.algorithm.beta > 0 and c.ref_model is None else None
    teacher = None
    if cfg.algorithm.teacher.model:
        device = str(next(c.model.parameters()).device)
        teacher = load_teacher(cfg.algorithm.teacher.model, c.tokenizer, trainer, device,
                               resolve_dtype(cfg.model.dtype, device), cfg.model.attn_implementation,
                               seed=cfg.run.seed, log=say)
        say(f"teacher: {cfg.algorithm.teacher.model} (reverse KL x {cfg.algorithm.teacher.coef:g}, "
            f"RL term x {cfg.algorithm.teacher.rl_weight:g})")
    elif cfg.algorithm.hint_distill.enabled:
        hd = cfg.algorithm.hint_distill
        if getattr(c.task, "feedback", None) is None:
            say(f"hint distillation: task {c.task.name!r} has no feedback function; only env feedback (tool errors) "
                "will become hints")
        teacher = SelfHintTeacher(trainer, c.tokenizer, hd.template, hd.max_hint_tokens)
        say(f"teacher: the policy with the sample's feedback as a hint (reverse KL x {hd.coef:g})")
    return PolicyGradientStepper(cfg, trainer, collector, sync, pass_thresholds(c), c.train_params.max_tokens,
                                 ref_model=c.ref_model, ref_disable_adapter=lora_ref,
                                 version=c.sampler.policy_version, teacher=teacher,
                                 task=c.task)


@STEPPERS.register("es")
def evolution_strategies(cfg: Config, c: Components, run_dir: Path, say: Callable[[str], None]) -> ESStepper:
    return ESStepper(cfg, c.model, c.env, c.sampler, c.task.train_rows, c.train_params, pass_thresholds(c), run_dir,
                     say=say)


def make_stepper(cfg: Config, c: Components, run_dir: Path, say: Callable[[str], None]):
    return STEPPERS[cfg.algorithm.stepper](cfg, c, run_dir, say)
