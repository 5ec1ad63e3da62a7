"""Samplers: the async Sampler protocol and the in-process HF sampler."""

from posttrain.sampling.base import Sampler
from posttrain.sampling.hf_sampler import HFSampler

__all__ = ["HFSampler", "Sampler"]
