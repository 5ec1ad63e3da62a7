"""Samplers: the async Sampler protocol and the in-process HF sampler.

HFSampler is imported on first use: `posttrain.sampling.base` (the protocol envs and Ray workers import) must
not pull in torch and transformers.
"""

from typing import Any

from posttrain.sampling.base import Sampler

__all__ = ["HFSampler", "Sampler"]


def __getattr__(name: str) -> Any:
    if name == "HFSampler":
        from posttrain.sampling.hf_sampler import HFSampler

        return HFSampler
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
