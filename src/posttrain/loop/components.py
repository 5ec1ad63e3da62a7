"""Build the run's shared components (model, tokenizer, task, env, the policy's sampler, the reference model)
from a Config. The stepper (loop/wiring.py) builds what only it needs: the Trainer, collectors, weight sync."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from posttrain.config.schema import Config
from posttrain.envs.base import TaskEnv, make_env
from posttrain.envs.task import Task, prepare_task
from posttrain.models.load import stop_token_ids
from posttrain.models.lora import count_parameters
from posttrain.models.policy import load_base_model, seed_everything, set_threads, with_lora
from posttrain.rewards.judges.setup import configure_task_judges
from posttrain.sampling.context import run_budget
from posttrain.sampling.hf_sampler import HFSampler
from posttrain.sampling.precision import precision_advice
from posttrain.tasks.from_config import task_from_config
from posttrain.tasks.prompt_size import check_prompt_sizes
from posttrain.types import SampleParams


@dataclass(frozen=True)
class Components:
    """What a run is built from. Frozen: a part that changes (the reference after a warm start, the env wrapped for
    guidance, the env workers once closed) makes new Components (`dataclasses.replace`)."""

    model: Any
    tokenizer: Any
    task: Task
    env: TaskEnv  # SingleTurnEnv, ToolEnv or the task's own (Task.env_factory)
    sampler: HFSampler  # generates with the policy's own module (eval, and rollouts in the sync loop)
    ref_model: Any | None
    train_params: SampleParams
    eval_params: SampleParams
    trainable_params: int
    total_params: int
    env_workers: Any = None  # cluster.envs=ray: the EnvWorkers the episodes live on (the Run closes them)


def sample_params(cfg: Config, task: Task) -> tuple[SampleParams, SampleParams]:
    max_tokens = cfg.sampling.max_tokens or task.max_tokens or 128
    stop = list(task.stop if cfg.sampling.stop is None else cfg.sampling.stop)
    train = SampleParams(
        max_tokens=max_tokens,
        temperature=cfg.sampling.temperature,
        top_p=cfg.sampling.top_p,
        top_k=cfg.sampling.top_k,
        stop=stop,
    )
    ev = SampleParams(max_tokens=max_tokens, temperature=cfg.sampling.eval_temperature, stop=stop)
    return train, ev


def build(cfg: Config, log=print) -> Components:
    set_threads(cfg)
    seed_everything(cfg.run.seed)
    task = task_from_config(cfg.task, seed=cfg.run.seed)  # task.dataset or task.name, + task.rewards and subset
    if "cache" in cfg.judge.model_fields_set:  # set in the config: it wins over the caches the task's judges chose
        configure_task_judges(task, cfg.judge.cache)
    prepare_task(task, log)  # one-off work before anything scores, e.g. repair tasks' baselines (tasks/baselines.py)
    model, tok = load_base_model(cfg, log)
    advice = precision_advice(cfg.sampling.precision, next(model.parameters()).device.type)
    if advice and cfg.cluster.backend == "local":
        log(f"note: {advice}")
    ref_model = None
    if cfg.algorithm.beta > 0 and cfg.algorithm.stepper == "policy_gradient":
        # The reference is only loaded when a KL term needs it (beta > 0). With LoRA it is the base model with
        # adapters disabled, so no second copy is held.
        ref_model = None if cfg.lora.enabled else copy.deepcopy(model).eval().requires_grad_(False)
    model = with_lora(cfg, model)
    trainable, total = count_parameters(model)
    train_params, eval_params = sample_params(cfg, task)
    sampler = HFSampler(
        model,
        tok,
        stop_token_ids(model, tok),
        seed=cfg.run.seed,
        graphs=cfg.sampling.cuda_graphs,
        prefix_cache_tokens=cfg.sampling.prefix_cache_tokens,
        context=run_budget(cfg, model),
    )
    check_prompt_sizes(task, sampler.context.max_context)  # before anything tokenizes a prompt (tasks/prompt_size.py)
    env_workers = None
    if cfg.cluster.envs == "ray":  # each episode's tools on a Ray actor (cluster/ray_episodes.py)
        from posttrain.cluster.ray_episodes import EnvWorkers, remote_env

        env_workers = EnvWorkers.start(cfg.cluster, task)
        env = remote_env(task, env_workers, tok, train_params)
    else:
        env = make_env(task, tok, train_params)
    return Components(
        model, tok, task, env, sampler, ref_model, train_params, eval_params, trainable, total, env_workers
    )
