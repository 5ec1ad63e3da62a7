"""The run's task from its config (`task:`): built from data (`task.dataset`, tasks/dataset.py) or loaded by name
(`task.name`, tasks/load.py) with the config's rewards added; then `task.subset`, the named rewards' columns checked
against the rows, and the reward timeout. Every place that builds a run's task calls this (loop/components.py, the
trainer ranks in training/launch.py), so a dataset task is the same task everywhere."""

from __future__ import annotations

from posttrain.config.schema import TaskConfig
from posttrain.envs.task import Task, TaskLoadError
from posttrain.rewards.from_config import RewardConfigError, add_rewards, check_columns
from posttrain.tasks.dataset import load_dataset_task
from posttrain.tasks.load import apply_subset, load_task


def task_from_config(tc: TaskConfig, seed: int = 0) -> Task:
    if tc.dataset is not None:
        task = load_dataset_task(tc, seed)
    else:
        task = load_task(tc.name, tc.options, seed=seed)
        if tc.rewards:  # rewards named in the config, e.g. a reward model or `math` (rewards/from_config.py)
            task.rubric = add_rewards(task.rubric, tc.rewards, tc.answer_format)
            try:
                check_columns(task.rubric, _columns(task))
            except RewardConfigError as e:
                raise TaskLoadError(f"task {tc.name!r}: {e}") from None
    if tc.subset:
        task = apply_subset(task, tc.subset)
    task.rubric.timeout_s = tc.reward_timeout_s
    if tc.max_observation_chars is not None:  # the config wins over the task's own cut of tool results
        task.max_observation_chars = tc.max_observation_chars
    task.tool_parser = tc.tool_parser or task.tool_parser  # None: the task's own
    task.reasoning_parser = tc.reasoning_parser or task.reasoning_parser
    return task


def _columns(task: Task) -> list[str]:
    seen: dict[str, None] = {}
    for r in task.train_rows + task.eval_rows:
        seen.update(dict.fromkeys(r))
    return list(seen)
