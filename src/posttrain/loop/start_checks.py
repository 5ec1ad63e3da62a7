"""What a run refuses at its start, checked by the same functions in the run and in `posttrain train --dry-run`
(`check_start`), so the two cannot disagree. Before them, reading the config (config/load.py) checks every value
the config's models can: task.rewards entries (config/reward_options.py), a mixture's parts, reasoning-gym's and
verifiers' own options and the eval-suite tasks (config/task_options.py), the answer formats; the tasks read the
same models when they load.

    check_names(cfg)                   every registry name: stepper, collector, optimizer, loss, advantage, ...
    task_from_config(cfg.task)         the data opens within its caps and has the columns; every reward and its
                                       options; a mixture's parts; task.subset (tasks/from_config.py)
    check_task(cfg, task)              loop.best_metric names a metric the held-out eval writes (loop/best_model.py)
    suite_tasks(cfg.eval_suite)        every eval-suite task loads (loop/eval_suite.py)
    check_prompt_sizes(task, context)  no prompt far over the model's context (tasks/prompt_size.py): the run with
                                       the loaded model's context (loop/components.build), the dry run with
                                       sampling.max_context when it is set

The run calls check_names first, then builds its components (the task through task_from_config, the prompt sizes
once the model is loaded), then check_task, then suite_tasks (loop/run.py). What needs the model itself (its
folder, its chat template, the env check's scoring, the judge audit) only the run checks.
"""

from __future__ import annotations

from dataclasses import dataclass

from posttrain.config.schema import Config
from posttrain.envs.task import Task
from posttrain.loop.best_model import check_best_metric, eval_metric_names
from posttrain.loop.eval_suite import SuiteTask, suite_tasks
from posttrain.tasks.from_config import task_from_config
from posttrain.tasks.prompt_size import check_prompt_sizes


@dataclass(frozen=True)
class Checked:
    """What a dry run loaded: the run's task and its eval-suite tasks."""

    task: Task
    suite: list[SuiteTask]

    def summary(self) -> str:
        t = self.task
        rewards = ", ".join(c.name for c in t.rubric.components)
        suite = f"; eval suite: {', '.join(s.task.name for s in self.suite)}" if self.suite else ""
        return f"task {t.name} ({len(t.train_rows)} train / {len(t.eval_rows)} held-out rows; rewards {rewards}){suite}"


def check_names(cfg: Config) -> None:
    """Every name a registry must hold: an unknown one raises (UnknownName, with the nearest) before any model
    loads."""
    from posttrain.algos import ADVANTAGES, IS_CORRECTIONS, LOSSES, TOKEN_WEIGHTS
    from posttrain.loop.wiring import COLLECTORS, STEPPERS
    from posttrain.training.optimizers import OPTIMIZERS

    a = cfg.algorithm
    named = [(STEPPERS, a.stepper), (COLLECTORS, cfg.loop.mode), (OPTIMIZERS, cfg.trainer.optimizer)]
    if a.stepper == "policy_gradient":
        named += [(LOSSES, a.loss), (ADVANTAGES, a.advantage), (IS_CORRECTIONS, a.is_correction)]
        named += [(TOKEN_WEIGHTS, a.token_weighting)]
    for registry, name in named:
        registry[name]  # a name no registry holds raises here


def check_task(cfg: Config, task: Task) -> None:
    """What the run's task decides about the config: loop.best_metric (when final/ is the best eval's model)."""
    if cfg.loop.final_model == "best":
        names = eval_metric_names(task, cfg.loop.eval_samples, cfg.algorithm.insights.enabled)
        check_best_metric(cfg.loop.best_metric, names)


def check_suite_prompts(suite: list[SuiteTask], max_context: int | None) -> None:
    """The eval-suite tasks' prompts against the context (None: not known, nothing to check)."""
    if max_context is None:
        return
    for s in suite:
        check_prompt_sizes(s.task, max_context)


def check_start(cfg: Config) -> Checked:
    """Everything a run would refuse at its start that needs no model, in the run's order; the first problem
    raises its PosttrainError (one line, the CLI prints it)."""
    check_names(cfg)
    task = task_from_config(cfg.task, seed=cfg.run.seed)
    if cfg.sampling.max_context is not None:
        check_prompt_sizes(task, cfg.sampling.max_context)
    check_task(cfg, task)
    suite = suite_tasks(cfg.eval_suite, cfg.run.seed)
    check_suite_prompts(suite, cfg.sampling.max_context)
    return Checked(task, suite)
