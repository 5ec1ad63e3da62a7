"""Samplers: the async Sampler protocol and the in-process HF sampler.

HFSampler is imported on first use: `posttrain.sampling.base` (the protocol envs and Ray workers import) must
not pull in torch and transformers.
"""

from typing import TYPE_CHECKING, Any

from posttrain.sampling.base import Sampler

if TYPE_CHECKING:  # for the type checker only: at run time __getattr__ imports it
    from posttrain.sampling.hf_sampler import HFSampler

__all__ = ["HFSampler", "Sampler"]


def __getattr__(name: str) -> Any:
    if name == "HFSampler":
        from posttrain.sampling.hf_sampler import HFSampler

        return HFSampler
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
