"""Environments: the Env protocol and the env kinds a task trains in (single turn, tools, gym text, OpenEnv,
agent servers). Built-in tasks and task loading live above, in posttrain.tasks."""

from posttrain.envs.base import Env
from posttrain.envs.single_turn import SingleTurnEnv
from posttrain.envs.task import Task, TaskLoadError

__all__ = ["Env", "SingleTurnEnv", "Task", "TaskLoadError"]
