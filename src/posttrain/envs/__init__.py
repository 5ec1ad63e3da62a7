"""Environments: the Env protocol, SingleTurnEnv, tasks (built-in and custom)."""

from posttrain.envs.base import Env
from posttrain.envs.custom import TaskLoadError, load_task
from posttrain.envs.single_turn import SingleTurnEnv
from posttrain.envs.task import Task

__all__ = ["Env", "SingleTurnEnv", "Task", "TaskLoadError", "load_task"]
