"""Samplers without a model: a scripted one (fixed replies; used by tests and to play demonstrations for the warm
start, loop/warm_start.py) and a wrapper that keeps what a sampler returned.

Useful to test an agent or an env without a model: `ScriptedSampler(tok, ["first reply", "second reply"])`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from posttrain.sampling.context import ContextBudget
from posttrain.sampling.hf_sampler import cut_at_stop
from posttrain.types import Completion, SampleParams


class ScriptedSampler:
    """Returns the given texts in order, one per `sample` call (tokenized, ending in `end_token_id` (default eos),
    logprob -0.5 each). Cycles when it runs out. Like the HF sampler, `text` is cut before a stop string while the
    ids keep it. `delay_s` makes each call slow (for timeout tests); `prompts` records every prompt it was given.
    `stop_ends_reply=True` copies the HF sampler exactly: a text that ends in one of the stop strings gets no end
    token (the model stopped at the string), which is what demonstrations for a warm start need."""

    def __init__(
        self,
        tokenizer: Any,
        texts: list[str],
        delay_s: float = 0.0,
        policy_version: int = 0,
        end_token_id: int | None = None,
        stop_ends_reply: bool = False,
        context: ContextBudget | None = None,
    ):
        self.tok = tokenizer
        self.context = context  # None: no limit; a budget: calls are fitted to it as a real sampler's are
        self.texts = list(texts)
        self.delay_s = delay_s
        self.policy_version = policy_version
        self.end_token_id = tokenizer.eos_token_id if end_token_id is None else end_token_id
        self.stop_ends_reply = stop_ends_reply
        self.calls = 0
        self.prompts: list[list[int]] = []

    def set_version(self, version: int) -> None:
        """The version later completions are tagged with (a test's weight sync)."""
        self.policy_version = version

    def decode(self, token_ids: list[int]) -> str:
        return self.tok.decode(token_ids, skip_special_tokens=True)

    async def sample(self, prompts_P: list[list[int]], params: SampleParams, n: int = 1) -> list[list[Completion]]:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.context is None:
            return self._sample(prompts_P, params, n)
        fitted = self.context.fit_rows(prompts_P, params)  # as a real sampler's: a row that does not fit fails alone
        return fitted.merge(self._sample(fitted.prompts_P, fitted.params, n), n)

    def _sample(self, prompts_P: list[list[int]], params: SampleParams, n: int) -> list[list[Completion]]:
        text = self.texts[self.calls % len(self.texts)]
        self.calls += 1
        self.prompts += [list(p) for p in prompts_P]
        ids = [int(i) for i in self.tok(text, add_special_tokens=False)["input_ids"]]
        if not (self.stop_ends_reply and any(text.endswith(s) for s in params.stop or [])):
            ids.append(self.end_token_id)
        shown = cut_at_stop(text, params.stop) if params.stop else text
        return [
            [Completion(list(ids), [-0.5] * len(ids), "stop", self.policy_version, text=shown) for _ in range(n)]
            for _ in prompts_P
        ]


class CapturingSampler:
    """Wraps a sampler and keeps every (prompt ids, Completion) it returned, in order, in `seen`."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.seen: list[tuple[list[int], Completion]] = []

    @property
    def policy_version(self) -> int:
        return self.inner.policy_version

    def set_version(self, version: int) -> None:
        self.inner.set_version(version)

    @property
    def context(self) -> ContextBudget | None:
        return self.inner.context

    def decode(self, token_ids: list[int]) -> str:
        return self.inner.decode(token_ids)

    async def sample(self, prompts_P: list[list[int]], params: SampleParams, n: int = 1) -> list[list[Completion]]:
        out = await self.inner.sample(prompts_P, params, n)
        for p, group in zip(prompts_P, out):
            self.seen.extend((list(p), c) for c in group)
        return out
