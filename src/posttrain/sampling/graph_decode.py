"""The GPU decode fast path: a static KV cache and the one-token decode step replayed as a CUDA graph.

On a GPU a 135M model's decode step is launch-bound: bench/gpu.py measured about 60 ms per token step at batch 64
on an H200 with the eager loop (30 layers of small kernels, each launched from Python), far from what the chip
can do. Capturing the step once and replaying it removes the launches. A CUDA graph needs fixed shapes and fixed
addresses, so this loop differs from HFSampler's eager one in four ways:

- the batch is padded up to a bucket (a power of two) and finished rows ride along until every row is done (no
  compaction), so one graph serves every step of a call;
- the KV cache is transformers' `StaticCache`, sized to a capacity bucket (a multiple of 128 tokens) and kept per
  (batch, capacity) across calls, so the captured graph's addresses stay valid (reset, not reallocated);
- the attention mask spans the whole capacity and never changes during a call: 1 from each row's first prompt
  token on (causal masking hides the positions not written yet);
- prefill runs eagerly on the padded batch, one row per completion (no prefix sharing: on a GPU the prefill of a
  batch is one parallel pass, and a static cache cannot change its batch size after it).

The step is `torch.compile(mode="reduce-overhead")` (cudagraph trees): compiled once per shape bucket, then
replayed. Sampling (temperature, top-k / top-p, the sampler's generator) stays eager and is the same code as the
eager loop, so with the same weights the two paths draw from the same distributions (tests/sampling compares
them on the CPU, where the step runs uncompiled through the same static-cache code).
"""

from __future__ import annotations

from typing import Any

import torch

from posttrain.sampling.padding import left_pad

CAPACITY_BUCKET = 128


def batch_bucket(n: int) -> int:
    """The smallest power of two >= n (at least 1)."""
    return 1 << max(n - 1, 0).bit_length()


def capacity_bucket(n: int, step: int = CAPACITY_BUCKET) -> int:
    return -(-n // step) * step


class GraphDecoder:
    """Per-sampler state of the fast path: the static caches and the compiled step, by shape bucket."""

    def __init__(self, model: Any, cache_arg: str, compile_step: bool = True):
        self.model, self.cache_arg = model, cache_arg
        self.compile_step = compile_step
        self._caches: dict[tuple[int, int], Any] = {}
        self._step = (
            torch.compile(self._forward, mode="reduce-overhead", dynamic=False) if compile_step else self._forward
        )

    def _forward(self, ids_B1: torch.Tensor, pos_B1: torch.Tensor, mask_BC: torch.Tensor, cache: Any) -> torch.Tensor:
        out = self.model(
            input_ids=ids_B1, attention_mask=mask_BC, position_ids=pos_B1, **{self.cache_arg: cache}, use_cache=True
        )
        return out.logits[:, -1].float()

    def cache(self, batch: int, capacity: int) -> Any:
        """The static cache for this bucket, emptied (its tensors keep their addresses)."""
        from transformers import StaticCache

        key = (batch, capacity)
        c = self._caches.get(key)
        if c is None:
            c = self._caches[key] = StaticCache(config=self.model.config, max_cache_len=capacity)
        else:
            for layer in c.layers:
                if getattr(layer, "is_initialized", False):
                    layer.cumulative_length.zero_()
        return c

    def decode_loop(self, sampler: Any, rows: list[list[int]], params: Any):
        """Same inputs and outputs as HFSampler._decode_loop: (tokens_BT, logps_BT, lengths_B, reasons, versions_T)."""
        dev = next(self.model.parameters()).device
        B, max_new = len(rows), params.max_tokens
        Bb = batch_bucket(B)
        Lp = max(len(r) for r in rows)
        C = capacity_bucket(Lp + max_new)
        padded_rows = rows + [rows[0]] * (Bb - B)  # bucket padding: decoded, then dropped
        ids_BL, mask_BC, pos_BL = left_pad(padded_rows, sampler.pad_id, C, dev)
        cache = self.cache(Bb, C)
        logits, v = sampler._forward_last(
            input_ids=ids_BL,
            attention_mask=mask_BC,
            position_ids=pos_BL,
            **{self.cache_arg: cache},
            use_cache=True,
            logits_to_keep=1,
        )
        logits = logits.float()
        versions_T = [v]  # the policy version behind each step's logits (an interruptible sampler may change it)
        next_pos = pos_BL[:, -1:] + 1
        tokens_BT = torch.full((Bb, max_new), sampler.pad_id, dtype=torch.long, device=dev)
        logps_BT = torch.zeros((Bb, max_new), dtype=torch.float32, device=dev)
        lengths_B = torch.zeros(Bb, dtype=torch.long, device=dev)
        done_B = torch.zeros(Bb, dtype=torch.bool, device=dev)
        done_B[B:] = True  # the bucket's padding rows never count
        reasons = ["length"] * B
        stop_ids = torch.tensor(sampler.stop_token_ids, dtype=torch.long, device=dev)
        # The rows sampled each step follow the eager loop's compaction rule, so both loops draw the same random
        # numbers from the generator and, with the same weights, produce the same tokens. The model still runs
        # every row of the bucket (a fixed shape); a row outside `sel` is finished and is fed a pad token.
        sel = torch.arange(B, device=dev)
        feed_B = torch.full((Bb,), sampler.pad_id, dtype=torch.long, device=dev)
        for t in range(max_new):
            tok_s = sampler._take_tokens(
                logits[sel], sel, t, params, tokens_BT, logps_BT, lengths_B, done_B, reasons, stop_ids
            )
            if bool(done_B.all()) or t == max_new - 1:
                break
            feed_B.fill_(sampler.pad_id)
            feed_B[sel] = tok_s
            idx = sampler._compaction(sel, done_B)
            if idx is not None:
                sel = sel[idx]
            if self.compile_step:
                torch.compiler.cudagraph_mark_step_begin()  # the last step's outputs are consumed: reuse them
            with sampler._step_gate():
                logits = self._step(feed_B[:, None], next_pos, mask_BC, cache)
                versions_T.append(sampler.policy_version)
            next_pos = next_pos + 1
        return tokens_BT[:B].cpu(), logps_BT[:B].cpu(), lengths_B[:B].tolist(), reasons, versions_T
