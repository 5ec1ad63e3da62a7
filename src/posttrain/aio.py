"""Running a coroutine from sync code, wherever that code runs (a worker thread, or a thread with a loop)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


def run_sync(make_coro: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine to completion from sync code. Reward functions are sync and usually run in the
    rubric's worker thread (no loop there); with the rubric timeout off they run on the env's loop thread,
    where asyncio.run would fail, so then the coroutine gets a thread of its own."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make_coro())
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="grade") as ex:
        return ex.submit(lambda: asyncio.run(make_coro())).result()
