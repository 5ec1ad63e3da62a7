"""Coalescing concurrent `sample()` calls into one batch.

Envs are written one episode at a time, so a step's rollouts arrive as many small `sample()` calls started in
the same event-loop turn. `Coalescer` gathers the calls of a turn, groups them by sampling parameters, hands each
group to `sample_rows(rows, params)` as one flat list of rows (a prompt repeated n times for n completions), and
gives every caller back its own slice. A failure of a batch fails every call in it, nothing else.

With a context budget (sampling/context.py), each caller's rows are checked before they join a batch: a prompt that
does not fit never reaches the engine, which would refuse the whole batch; it fails its own row alone (a caller of
one prompt gets ContextOverflow, a caller of several a "context_overflow" completion for that row: `fit_rows`), or
has its max_tokens cut.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from posttrain.sampling.context import ContextBudget
from posttrain.types import Completion, SampleParams

SampleRows = Callable[[list[list[int]], SampleParams], Awaitable[list[Completion]]]


class Coalescer:
    def __init__(self, sample_rows: SampleRows, budget: ContextBudget | None = None):
        self.sample_rows = sample_rows
        self.budget = budget
        self._pending: list = []
        self._flusher: asyncio.Future | None = None

    async def sample(self, prompts_P: list[list[int]], params: SampleParams, n: int = 1) -> list[list[Completion]]:
        if self.budget is None:
            return await self._queued(prompts_P, params, n)
        fitted = self.budget.fit_rows(prompts_P, params)  # this caller's rows only: raises before the batch
        return fitted.merge(await self._queued(fitted.prompts_P, fitted.params, n), n)

    async def _queued(self, prompts_P: list[list[int]], params: SampleParams, n: int) -> list[list[Completion]]:
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self._pending.append((prompts_P, params, n, fut))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.ensure_future(self._flush())
        return await fut

    async def _flush(self) -> None:
        while self._pending:
            for _ in range(3):  # let every coroutine started in this turn enqueue its request
                await asyncio.sleep(0)
            pending, self._pending = self._pending, []
            by_params: dict[str, list] = {}
            for item in pending:
                by_params.setdefault(repr(item[1]), []).append(item)
            for items in by_params.values():
                rows = [p for prompts, _, n, _ in items for p in prompts for _ in range(n)]
                try:
                    flat = await self.sample_rows(rows, items[0][1])
                except Exception as e:  # noqa: BLE001 - hand the failure to every waiting caller
                    for *_, fut in items:
                        if not fut.done():
                            fut.set_exception(e)
                    continue
                i = 0
                for prompts, _, n, fut in items:
                    res = []
                    for _ in prompts:
                        res.append(flat[i : i + n])
                        i += n
                    if not fut.done():
                        fut.set_result(res)
