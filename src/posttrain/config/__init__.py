"""Run configuration: pydantic models, YAML loading, dotted overrides. Does not import torch."""

from posttrain.config.load import ConfigError, apply_override, load_config, to_yaml, validate
from posttrain.config.schema import (
    AlgorithmConfig,
    Config,
    LoggingConfig,
    LoopConfig,
    LoraConfig,
    ModelConfig,
    RunConfig,
    SamplingConfig,
    TaskConfig,
    TrainerConfig,
)

__all__ = [
    "AlgorithmConfig",
    "Config",
    "ConfigError",
    "LoggingConfig",
    "LoopConfig",
    "LoraConfig",
    "ModelConfig",
    "RunConfig",
    "SamplingConfig",
    "TaskConfig",
    "TrainerConfig",
    "apply_override",
    "load_config",
    "to_yaml",
    "validate",
]
