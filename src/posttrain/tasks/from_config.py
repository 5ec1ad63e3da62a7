"""The run's task from its config (`task:`): built from data (`task.dataset`, tasks/dataset.py) or loaded by name
(`task.name`, tasks/load.py) with the config's rewards added; then `task.subset`, the named rewards' columns checked
against the rows, and the reward timeout. Every place that builds a run's task calls this (loop/components.py, the
trainer ranks in training/launch.py), so a dataset task is the same task everywhere."""

from __future__ import annotations

from dataclasses import replace

from posttrain.config.schema import TaskConfig
from posttrain.envs.task import Task, TaskLoadError
from posttrain.rewards.from_config import RewardConfigError, add_rewards, check_columns
from posttrain.rows import columns
from posttrain.tasks.dataset import load_dataset_task
from posttrain.tasks.load import apply_subset, load_task


def task_from_config(tc: TaskConfig, seed: int = 0) -> Task:
    if tc.dataset is not None:
        task = load_dataset_task(tc, seed)
    else:
        task = load_task(tc.name, tc.options, seed=seed, max_observation_chars=tc.max_observation_chars)
        if tc.rewards:  # rewards named in the config, e.g. a reward model or `math` (rewards/from_config.py)
            task = replace(task, rubric=add_rewards(task.rubric, tc.rewards, tc.answer_format))
            try:
                check_columns(task.rubric, columns(task.train_rows + task.eval_rows))
            except RewardConfigError as e:
                raise TaskLoadError(f"task {tc.name!r}: {e}") from None
    if tc.subset:
        task = apply_subset(task, tc.subset)
    task.rubric.timeout_s = tc.reward_timeout_s
    # The config's settings win over the task's own (None: the task's); a new task, the built one is not edited.
    return replace(
        task,
        max_observation_chars=tc.max_observation_chars or task.max_observation_chars,  # the config's: >= 1
        tool_parser=tc.tool_parser or task.tool_parser,
        reasoning_parser=tc.reasoning_parser or task.reasoning_parser,
        thinking=tc.thinking or task.thinking,
    )
