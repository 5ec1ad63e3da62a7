"""posttrain: reinforcement-learning post-training for language models and LLM agents.

    posttrain.train(...)                      a whole run from a config (the CLI's `posttrain train`)

The pieces a loop of your own is built from are importable from here too, in the order one step uses them
(examples/minimal_loop.py is a GRPO loop from these alone):

    load_model, ensure_pad_token, stop_token_ids         the policy and its tokenizer
    load_task, Task, SingleTurnEnv, score_groups        rows, an env that rolls them out, the rubric's rewards
    HFSampler, SampleParams, Completion, Sampler        sampling (the own decode loop; the Sampler protocol)
    Trajectory, Turn, Group, Sequence, Batch            what a rollout produces and what trains
    build_batch, BatchOptions, sequences_from_groups   group advantages and the trained part of a batch
    Trainer, LOSSES, ADVANTAGES, LossParams             forward_backward + optim_step, the registries
    PolicyTrainer, StepSettings, Update                 the trainer's contract, a step's settings, its result
    WeightSync, SharedWeights, CopyWeights             the sampler serves the trainer's weights as a version
    Config, load_config                                 the configuration

They are imported on first use: `import posttrain` itself loads no torch (the CLI starts fast).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what a type checker sees (at run time the names resolve lazily, below)
    from posttrain.algos import ADVANTAGES, LOSSES, LossParams
    from posttrain.config import Config, load_config
    from posttrain.envs.base import score_groups
    from posttrain.envs.single_turn import SingleTurnEnv
    from posttrain.envs.task import Task
    from posttrain.loop.batch import BatchOptions, build_batch, sequences_from_groups
    from posttrain.loop.weight_sync import CopyWeights, SharedWeights, WeightSync
    from posttrain.models import ensure_pad_token, load_model, stop_token_ids
    from posttrain.sampling.base import Sampler
    from posttrain.sampling.hf_sampler import HFSampler
    from posttrain.tasks.load import load_task
    from posttrain.training.protocol import PolicyTrainer, StepSettings, Update
    from posttrain.training.trainer import Trainer
    from posttrain.types import Batch, Completion, Group, SampleParams, Sequence, Trajectory, Turn

__version__ = "0.1.0"

# name -> the module it lives in; resolved on first access (PEP 562)
_EXPORTS = {
    "load_model": "posttrain.models",
    "ensure_pad_token": "posttrain.models",
    "stop_token_ids": "posttrain.models",
    "load_task": "posttrain.tasks.load",
    "Task": "posttrain.envs.task",
    "SingleTurnEnv": "posttrain.envs.single_turn",
    "score_groups": "posttrain.envs.base",
    "HFSampler": "posttrain.sampling.hf_sampler",
    "Sampler": "posttrain.sampling.base",
    "SampleParams": "posttrain.types",
    "Completion": "posttrain.types",
    "Trajectory": "posttrain.types",
    "Turn": "posttrain.types",
    "Group": "posttrain.types",
    "Sequence": "posttrain.types",
    "Batch": "posttrain.types",
    "build_batch": "posttrain.loop.batch",
    "BatchOptions": "posttrain.loop.batch",
    "sequences_from_groups": "posttrain.loop.batch",
    "Trainer": "posttrain.training.trainer",
    "PolicyTrainer": "posttrain.training.protocol",
    "StepSettings": "posttrain.training.protocol",
    "Update": "posttrain.training.protocol",
    "LOSSES": "posttrain.algos",
    "ADVANTAGES": "posttrain.algos",
    "LossParams": "posttrain.algos",
    "WeightSync": "posttrain.loop.weight_sync",
    "SharedWeights": "posttrain.loop.weight_sync",
    "CopyWeights": "posttrain.loop.weight_sync",
    "Config": "posttrain.config",
    "load_config": "posttrain.config",
}

# Written out (not built from _EXPORTS) so linters and type checkers read it; tests/loop/test_minimal_loop.py
# checks the two agree.
__all__ = [
    "train",
    "__version__",
    "load_model",
    "ensure_pad_token",
    "stop_token_ids",
    "load_task",
    "Task",
    "SingleTurnEnv",
    "score_groups",
    "HFSampler",
    "Sampler",
    "SampleParams",
    "Completion",
    "Trajectory",
    "Turn",
    "Group",
    "Sequence",
    "Batch",
    "build_batch",
    "BatchOptions",
    "sequences_from_groups",
    "Trainer",
    "PolicyTrainer",
    "StepSettings",
    "Update",
    "LOSSES",
    "ADVANTAGES",
    "LossParams",
    "WeightSync",
    "SharedWeights",
    "CopyWeights",
    "Config",
    "load_config",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'posttrain' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next access skips this function
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


def train(config=None, **overrides):
    """Run a training job. `config` is a Config, a YAML path, or None (defaults); `overrides` are dotted keys
    with `__` for dots, e.g. train(loop__steps=5, model__name="tiny-random")."""
    from posttrain.config import Config, load_config
    from posttrain.loop import train as _train

    ovs = [f"{k.replace('__', '.')}={v}" for k, v in overrides.items()]
    if isinstance(config, Config):
        from posttrain.config import apply_override, validate

        data = config.model_dump()
        for ov in ovs:
            apply_override(data, ov)
        cfg = validate(data)
    else:
        cfg = load_config(config, ovs)
    return _train(cfg)
