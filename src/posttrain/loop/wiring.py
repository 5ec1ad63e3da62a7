"""The one place that picks how a run steps: a registry of stepper factories, keyed by `algorithm.stepper`.

    policy_gradient   Trainer + Collector (loop.mode: sync, or async with staleness admission) + WeightSync,
                      rollouts sampled in process or on Ray sampler actors (cluster.backend: SAMPLER_BACKENDS)
    es                evolution strategies: perturbed copies scored by the env, no Trainer

A factory gets the config, the run's components (loop/components.py) and the run directory, and returns a Stepper
(loop/run.py). Adding a schedule is a function registered here.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from posttrain.algos.prompt_selection import SelectionSettings
from posttrain.algos.registry import Registry
from posttrain.config.schema import Config
from posttrain.envs.faults import FaultyEnv
from posttrain.guidance.insights import InsightEnv, InsightMemory
from posttrain.guidance.profiles import ProfileBook, ProfileEnv, Rised
from posttrain.guidance.teacher import SelfHintTeacher, load_teacher
from posttrain.loop.async_collect import AsyncCollector, MeteredSampler
from posttrain.loop.collect import Collector, RolloutSpec, SyncCollector
from posttrain.loop.components import Components
from posttrain.loop.es_stepper import ESStepper
from posttrain.loop.pg_stepper import PolicyGradientStepper
from posttrain.loop.prompt_selector import PromptSelector
from posttrain.loop.row_choice import RisedRows, RowChooser, UniformRows
from posttrain.loop.step_plan import CollectPlan, StepPlan
from posttrain.loop.stepper import Stepper
from posttrain.loop.weight_sync import (
    CopyWeights,
    GatheredWeights,
    LowPrecisionCopy,
    SharedWeights,
    VersionedPush,
    WeightSync,
)
from posttrain.models.load import stop_token_ids
from posttrain.models.policy import resolve_dtype
from posttrain.obs.timers import BusyMeter
from posttrain.rewards.tags import JudgeTagger, RuleTagger, Taggers, load_vocabulary
from posttrain.sampling.base import Sampler, first_push
from posttrain.sampling.context import run_budget, text_config
from posttrain.sampling.hf_sampler import HFSampler
from posttrain.sampling.precision import low_precision_copy, should_pack
from posttrain.training.from_config import make_trainer, trainer_setup
from posttrain.training.launch import start_ranks, world_size
from posttrain.training.rank_plan import RankPlan
from posttrain.types import SampleParams

StepperFactory = Callable[[Config, Components, Path, Callable[[str], None]], Stepper]
CollectorFactory = Callable[[Config, Components, RowChooser], "tuple[Collector, WeightSync]"]
SamplerBackend = Callable[[Config, Components, bool], "tuple[Any, Any]"]  # (sampler, weight sync)
STEPPERS: Registry[StepperFactory] = Registry("stepper")
COLLECTORS: Registry[CollectorFactory] = Registry("loop mode")
SAMPLER_BACKENDS: Registry[SamplerBackend] = Registry("cluster backend")  # where rollouts are sampled (cluster.backend)


def pass_thresholds(c: Components) -> dict[str, float]:
    return {x.name: x.pass_threshold for x in c.task.rubric.components}


def rollout_sampler(cfg: Config, c: Components, own_copy: bool) -> tuple[Any, Any]:
    """The sampler rollouts use and the WeightSync that keeps it current, from the backend `cluster.backend`
    names, with the engine `sampling.engine` names (a backend registered as "<backend>:<engine>" wins over the plain
    one). Eval, the env check and the judge audit keep the policy's own in-process sampler (`c.sampler`)."""
    name = f"{cfg.cluster.backend}:{cfg.sampling.engine}"
    return SAMPLER_BACKENDS[name if name in SAMPLER_BACKENDS else cfg.cluster.backend](cfg, c, own_copy)


@SAMPLER_BACKENDS.register("local")
def local_rollout_sampler(cfg: Config, c: Components, own_copy: bool) -> tuple[HFSampler, Any]:
    """In this process: the policy's own sampler (a version bump), a full-precision copy (the async loop: training
    and generation overlap), or a low-precision copy (sampling.precision), refreshed at each sync."""
    p = cfg.sampling.precision
    packed = should_pack(c.model, p, cfg.sampling.packed_weights, holds_copy=own_copy or p != "fp32")
    if p == "fp32" and not own_copy and not packed:
        return c.sampler, SharedWeights(c.sampler)
    # A packed fp32 copy is refreshed like a low-precision one (merged and re-packed at each sync).
    own = p != "fp32" or packed
    model = low_precision_copy(c.model, p, packed=packed) if own else copy.deepcopy(c.model).eval()
    sampler = HFSampler(
        model,
        c.tokenizer,
        stop_token_ids(c.model, c.tokenizer),
        seed=cfg.run.seed,
        graphs=cfg.sampling.cuda_graphs and p == "fp32",
        interruptible=own_copy and cfg.loop.mode == "async" and cfg.loop.interruptible,
        prefix_cache_tokens=cfg.sampling.prefix_cache_tokens,
        context=c.sampler.context,
    )
    sampler.generator.set_state(c.sampler.generator.get_state())
    sampler.policy_version = c.sampler.policy_version
    return sampler, (LowPrecisionCopy(c.model, sampler, p) if own else CopyWeights(c.model, sampler))


@SAMPLER_BACKENDS.register("ray")
def ray_rollout_sampler(cfg: Config, c: Components, own_copy: bool) -> tuple[Any, Any]:
    """Sampler actors on Ray (cluster/), each with its own copy of the policy, so both loop modes are served; the
    weight transport (cluster/ray_weights.py) loads the trainer's weights into them now and at every sync. Ray is
    imported here only, so the local backend never starts it."""
    from posttrain.cluster.ray_sampler import RaySamplerPool
    from posttrain.cluster.ray_weights import ray_weight_sync

    pool = RaySamplerPool.start(cfg, c.tokenizer)
    try:  # cluster.weight_transport: shared memory on this node, the group elsewhere, or the object store
        sync = ray_weight_sync(cfg, c.model, pool)
        first_push(sync, c.sampler.policy_version)  # the sampler serves what the trainer holds now
    except BaseException:
        pool.close()  # a refused transport or a failed first push must not leave the actors running
        raise
    return pool, sync


@SAMPLER_BACKENDS.register("server")
def server_rollout_sampler(cfg: Config, c: Components, own_copy: bool) -> tuple[Any, Any]:
    """An OpenAI-compatible inference server (posttrain serve, vLLM, SGLang) samples the rollouts; each sync writes
    the trainable weights to cluster.weights_dir and asks the server to reload them (sampling/weight_ipc.py
    ServerWeights: timeout and bounded retries, and the server must answer with the pushed version). The server
    holds its own copy, so both loop modes are served."""
    from posttrain.sampling.openai_sampler import OpenAISampler
    from posttrain.sampling.weight_ipc import ServerWeights

    cc = cfg.cluster
    if cc.server_url is None or cc.weights_dir is None:  # the config check says so first (config/schema.py)
        raise ValueError("cluster.backend=server needs cluster.server_url and cluster.weights_dir")
    key = cc.server_api_key or os.environ.get("POSTTRAIN_API_KEY")
    sampler = OpenAISampler(
        cc.server_url,
        model=cc.server_model,
        tokenizer=c.tokenizer,
        timeout_s=cc.server_timeout_s,
        api_key=key or "x",
        vocab_size=getattr(text_config(c.model), "vocab_size", None),
        context=run_budget(cfg, c.model),
    )
    sync = VersionedPush(
        ServerWeights(c.model, cc.weights_dir, cc.server_url, timeout_s=cc.server_timeout_s, api_key=key), sampler
    )
    first_push(sync, c.sampler.policy_version)  # the server serves what the trainer holds now
    return sampler, sync


@SAMPLER_BACKENDS.register("local:vllm")
def local_vllm_sampler(cfg: Config, c: Components, own_copy: bool) -> tuple[Any, Any]:
    """A vLLM engine in this process (sampling/engines.py); it holds its own weights, so both loop modes are served."""
    from posttrain.sampling.engines import local_vllm

    return local_vllm(cfg, c)


@SAMPLER_BACKENDS.register("server:vllm")
def server_vllm_sampler(cfg: Config, c: Components, own_copy: bool) -> tuple[Any, Any]:
    """cluster.num_servers vLLM servers, started and supervised here; weights pushed to each every step. What they
    do (started, restarted, retired) is said on the run's console, as logging.console allows."""
    from posttrain.cluster.server_loads import ServerPoolWeights
    from posttrain.cluster.vllm_servers import VLLMServerPool
    from posttrain.obs.console import print_line
    from posttrain.sampling.engines import engine_model_dir, engine_spec, work_dir
    from posttrain.sampling.weight_transfer import group_backend

    say = partial(print_line, enabled=cfg.logging.console)
    cc = cfg.cluster
    wd = work_dir(cfg)
    # Servers get merged full weights under LoRA too (one reload path per server).
    spec = engine_spec(cfg, c.model, engine_model_dir(cfg, c.model, c.tokenizer, wd, log=say))
    pool = VLLMServerPool.start(
        spec,
        c.tokenizer,
        stop_token_ids(c.model, c.tokenizer),
        cc.num_servers,
        wd,
        timeout_s=cc.server_timeout_s,
        start_timeout_s=cc.server_start_timeout_s,
        max_restarts=cc.max_restarts,
        log=say,
        context=run_budget(cfg, c.model, spec.max_model_len),
        transport="shared_memory" if cc.weight_transport == "auto" else cc.weight_transport,
        in_flight=cfg.sampling.vllm.weight_update == "in_flight",
        group_backend=group_backend(),
        bucket_mb=cc.weight_bucket_mb,
    )
    sync = ServerPoolWeights(c.model, pool)
    first_push(sync, c.sampler.policy_version)  # the sampler serves what the trainer holds now
    return pool, sync


def rollout_spec(cfg: Config, c: Components, sampler: Sampler) -> RolloutSpec:
    """The run's training rollouts: its env (with injected faults when `debug.rollout_fault_rate` asks, a test
    setting), G per prompt, sampling settings and the soft overlong penalty."""
    a, env = cfg.algorithm, c.env
    if cfg.debug.rollout_fault_rate > 0:  # test only: training rollouts fail on purpose (envs/faults.py)
        env = FaultyEnv(env, cfg.debug.rollout_fault_rate, cfg.run.seed)
    return RolloutSpec(
        env, sampler, c.task.train_rows, a.num_generations, c.train_params, a.overlong_buffer_frac, a.overlong_penalty
    )


@COLLECTORS.register("sync")
def sync_collector(cfg: Config, c: Components, rows: RowChooser) -> tuple[Collector, WeightSync]:
    """Roll out now, when the step asks."""
    sampler, sync = rollout_sampler(cfg, c, own_copy=False)
    return SyncCollector(CollectPlan.from_config(cfg), rollout_spec(cfg, c, sampler), rows), sync


@COLLECTORS.register("async")
def async_collector(cfg: Config, c: Components, rows: RowChooser) -> tuple[Collector, WeightSync]:
    """Rollout workers run ahead with a sampler that holds its own copy of the model, so training and generation
    overlap; each sync copies the weights in."""
    sampler, sync = rollout_sampler(cfg, c, own_copy=True)
    meters = {k: BusyMeter() for k in ("model_call", "rollout")}
    rollouts = rollout_spec(cfg, c, MeteredSampler(sampler, meters["model_call"]))
    return AsyncCollector(CollectPlan.from_config(cfg), rollouts, meters, rows), sync


def row_chooser(
    cfg: Config, n_rows: int, plugins: dict[str, Any], say: Callable[[str], None]
) -> tuple[RowChooser, dict[str, Any]]:
    """Which rows each step draws (loop/row_choice.py), and the stepper's plugins with it: an adaptive chooser
    joins them (its record is run state, saved with each checkpoint); `plugins` itself is left as it was."""
    if "rised" in plugins and cfg.algorithm.rised.selection:  # profile-based (sync collector; checked in the config)
        if cfg.loop.prompt_selection != "uniform":
            say(
                f"prompt selection: RISED's (algorithm.rised.selection) instead of loop.prompt_selection="
                f"{cfg.loop.prompt_selection}"
            )
        return RisedRows(plugins["rised"], cfg.run.seed), plugins
    if cfg.loop.prompt_selection == "uniform":  # uniform adds no state: its runs and checkpoints stay as before
        return UniformRows(cfg.run.seed), plugins
    sel = cfg.loop.selection
    selector = PromptSelector(
        cfg.loop.prompt_selection,
        n_rows,
        cfg.run.seed,
        SelectionSettings(sel.replay_share, sel.retire_after, sel.backoff_after, sel.revisit_every, sel.revisit_slots),
    )
    return selector, {**plugins, "prompt_selection": selector}


def with_feedback_envs(
    cfg: Config, c: Components, run_dir: Path, say: Callable[[str], None]
) -> tuple[Components, dict[str, Any]]:
    """The env wrapped for the methods that learn from words (guidance/insights.py, guidance/profiles.py), and their run
    state for the stepper (saved in its checkpoints)."""
    plugins: dict[str, Any] = {}
    a = cfg.algorithm
    if a.insights.enabled:  # RLTL;DR: rollouts read and write the task's insights
        ic = a.insights
        memory = InsightMemory(ic.per_task, ic.max_tasks)
        write = SampleParams(max_tokens=ic.max_tokens, temperature=ic.temperature, stop=["\n"])
        c = replace(
            c,
            env=InsightEnv(
                c.env,
                memory,
                c.tokenizer,
                ic.unconditioned_share,
                ic.per_group,
                write,
                seed=cfg.run.seed,
                log_path=run_dir / "insights.jsonl",
            ),
        )
        plugins["insights"] = memory
        say(
            f"insights: up to {ic.per_task} per task, {1 - ic.unconditioned_share:.0%} of rollouts read them, "
            f"the rest learn toward them (x {ic.coef:g})"
        )
    if a.rised.enabled:  # RISED: rubric tags on every rollout
        rc = a.rised
        vocab = load_vocabulary(rc.vocabulary)
        judge = None
        if any(not t.rule for t in vocab):
            from posttrain.rewards.judges.cache import JudgeCache
            from posttrain.rewards.judges.local_hf import LocalHFBackend
            from posttrain.rewards.judges.runner import JudgeRunner

            judge = JudgeTagger(
                vocab, JudgeRunner(LocalHFBackend(rc.judge_model, seed=cfg.run.seed), cache=JudgeCache(cfg.judge.cache))
            )
        book = ProfileBook([t.name for t in vocab])
        rised = Rised(vocab, Taggers(RuleTagger(vocab), judge), book, rc.candidates, rc.window, seed=cfg.run.seed)
        c = replace(c, env=ProfileEnv(c.env, rised.taggers, vocab, book, rc.negative, rc.penalty, rc.positive_distill))
        plugins["rised"] = rised
        say(
            f"rised: {len(vocab)} tags ({sum(t.rule is None for t in vocab)} by the judge), negative: {rc.negative}, "
            f"selection: {'on' if rc.selection else 'off'}, positive distillation: "
            f"{'on' if rc.positive_distill else 'off'}"
        )
    return c, plugins


@STEPPERS.register("policy_gradient")
def policy_gradient(cfg: Config, c: Components, run_dir: Path, say: Callable[[str], None]) -> PolicyGradientStepper:
    plan = StepPlan.from_config(cfg, c.train_params.max_tokens)  # what the stepper does, decided here once
    setup = trainer_setup(cfg)
    if (world := world_size(cfg.trainer.world_size)) > 1:  # trainer ranks (training/distributed.py); rank 0 runs this
        say(f"trainer: {world} ranks, " + ("FSDP2-sharded" if cfg.trainer.sharding == "fsdp2" else "data parallel"))
        ranks = RankPlan.of(cfg.model, cfg.lora, cfg.run.seed, setup, cfg.algorithm, plan.loss.params)
        trainer = start_ranks(ranks, c.model, c.tokenizer.pad_token_id)
    else:
        if cfg.trainer.sharding == "fsdp2":  # a checkpoint of a sharded run resumes here: the same state format
            say("trainer: one rank, nothing to shard (trainer.sharding=fsdp2 applies from world_size 2)")
        trainer = make_trainer(setup, c.model, c.tokenizer.pad_token_id)
    c, plugins = with_feedback_envs(cfg, c, run_dir, say)
    rows, plugins = row_chooser(cfg, len(c.task.train_rows), plugins, say)
    collector, sync = COLLECTORS[cfg.loop.mode](cfg, c, rows)
    if trainer.sharded:  # the sampler's model is not the trainer's: gather into it first
        sync = GatheredWeights(trainer, c.model, sync)
    lora_ref = c.model.disable_adapter if cfg.algorithm.beta > 0 and c.ref_model is None else None
    teacher = None
    if cfg.algorithm.teacher.model:
        device = str(next(c.model.parameters()).device)
        teacher = load_teacher(
            cfg.algorithm.teacher.model,
            c.tokenizer,
            trainer,
            device,
            resolve_dtype(cfg.model.dtype, device),
            cfg.model.attn_implementation,
            seed=cfg.run.seed,
            log=say,
        )
        say(
            f"teacher: {cfg.algorithm.teacher.model} (reverse KL x {cfg.algorithm.teacher.coef:g}, "
            f"RL term x {cfg.algorithm.teacher.rl_weight:g})"
        )
    elif plan.self_teacher is not None:
        a, (kind, coef) = cfg.algorithm, (plan.self_teacher.kind, plan.self_teacher.coef)
        if kind == "hint" and a.hint_distill.enabled and c.task.feedback is None:
            say(
                f"hint distillation: task {c.task.name!r} has no feedback function; only env feedback (tool errors) "
                "will become hints"
            )
        cap = plan.self_teacher.hint_cap
        teacher = SelfHintTeacher(trainer, c.tokenizer, cap, max_context=c.sampler.context.max_context)
        what = (
            ("the feedback" if a.hint_distill.enabled else "a remedy's format hint, once a stall starts")
            if kind == "hint"
            else f"its {kind} hint"
        )
        say(f"teacher: the policy itself with {what} in context (reverse KL x {coef:g})")
    return PolicyGradientStepper(
        plan,
        trainer,
        collector,
        sync,
        pass_thresholds(c),
        ref_model=c.ref_model,
        ref_disable_adapter=lora_ref,
        version=c.sampler.policy_version,
        teacher=teacher,
        task=c.task,
        plugins=plugins,
    )


@STEPPERS.register("es")
def evolution_strategies(cfg: Config, c: Components, run_dir: Path, say: Callable[[str], None]) -> ESStepper:
    return ESStepper(
        cfg, c.model, c.env, c.sampler, c.task.train_rows, c.train_params, pass_thresholds(c), run_dir, say=say
    )


def make_stepper(cfg: Config, c: Components, run_dir: Path, say: Callable[[str], None]):
    return STEPPERS[cfg.algorithm.stepper](cfg, c, run_dir, say)
