"""Reuse a multi-turn episode's KV cache from one turn to the next.

In a multi-turn episode every prompt is the previous turn's prompt and completion plus the env's reply (the prefix
contract, types.Trajectory.sequence). Prefilling each turn from scratch recomputes the whole history: with 16
episodes at ~1,000 tokens of history, prefill was nearly all of a reversal turn's time on the 2-core CPU (an
18-turn held-out eval of 16 maps ran for over 9 minutes). `PrefixStore` keeps the KV of the rows a call asked it to
keep (`SampleParams.keep_prefix`, set by the multi-turn envs) keyed by their tokens; the next call whose prompt
extends a stored row prefills only the new tokens.

Stored KV is only valid for the weights that computed it. Entries are dropped whenever the weights may have
changed: a new `policy_version`, any in-place write to a trained parameter (torch's per-tensor version counters,
so an optimizer step or an ES perturbation counts), or an explicit `clear()` (the sampler's weight syncs call
it). The reused KV was computed in another batch, so its floats can differ from a fresh prefill's by rounding
(measured in tests/sampling/test_prefix_cache.py); the sampler's log-probs stay the behaviour policy's, which is
what the losses use.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch

LayerKV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys and values, each (1, heads, tokens, dim)


def weights_signature(model: Any, policy_version: int) -> tuple[int, int]:
    """Changes whenever a trained parameter is written in place (or the policy version moves). Only parameters
    that train are counted, so merging LoRA adapters into the frozen base for a decode and taking them out again
    (HFSampler does it every call) does not void the store; a model with none trainable (a sampler's own copy,
    written only through weight syncs, which clear the store) counts them all."""
    params = [p for p in model.parameters() if p.requires_grad] or list(model.parameters())
    return policy_version, sum(p._version for p in params)


class PrefixStore:
    """Finished rows' KV caches by token sequence, least recently used evicted past `max_tokens` tokens."""

    def __init__(self, max_tokens: int):
        if max_tokens < 1:
            raise ValueError(f"prefix cache size must be >= 1 token, got {max_tokens}")
        self.max_tokens = max_tokens
        self._entries: OrderedDict[tuple[int, ...], LayerKV] = OrderedDict()
        self._tokens = 0
        self.signature: tuple[int, int] | None = None
        self.hits = self.misses = self.reused_tokens = self.prefilled_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def tokens(self) -> int:
        return self._tokens

    def clear(self) -> None:
        self._entries.clear()
        self._tokens = 0

    def validate(self, signature: tuple[int, int]) -> None:
        """Drop everything if the weights changed since the entries were stored."""
        if signature != self.signature:
            self.clear()
            self.signature = signature

    def lookup(self, prompt: list[int]) -> tuple[int, LayerKV] | None:
        """The longest stored sequence that is a strict prefix of `prompt` (at least one token must be left to
        prefill, for the logits of the next token): (its length, its KV), or None."""
        best: tuple[int, ...] | None = None
        n = len(prompt)
        for key in self._entries:
            k = len(key)
            if k < n and (best is None or k > len(best)) and tuple(prompt[:k]) == key:
                best = key
        if best is None:
            return None
        self._entries.move_to_end(best)
        return len(best), self._entries[best]

    def put(self, key: tuple[int, ...], kv: LayerKV) -> None:
        """Store a row's KV. Entries it extends are dropped (the next turn only needs the longest)."""
        if not key or len(key) > self.max_tokens:
            return
        for old in [k for k in self._entries if len(k) <= len(key) and key[: len(k)] == k]:
            self._drop(old)
        self._entries[key] = kv
        self._tokens += len(key)
        while self._tokens > self.max_tokens:
            self._drop(next(iter(self._entries)))

    def _drop(self, key: tuple[int, ...]) -> None:
        del self._entries[key]
        self._tokens -= len(key)

    def drain_metrics(self) -> dict[str, float]:
        """sampling/prefix_* since the last drain: prompts that reused a stored prefix, the tokens reused and the
        tokens prefilled anyway."""
        if not (self.hits or self.misses):
            return {}
        m = {
            "sampling/prefix_hits": float(self.hits),
            "sampling/prefix_misses": float(self.misses),
            "sampling/prefix_reused_tokens": float(self.reused_tokens),
            "sampling/prefill_tokens": float(self.prefilled_tokens),
            "sampling/prefix_cached_tokens": float(self._tokens),
        }
        self.hits = self.misses = self.reused_tokens = self.prefilled_tokens = 0
        return m
