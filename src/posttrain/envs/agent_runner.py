"""Running one agent function for AgentEnv (envs/agent.py): `async def agent(client, row)` on the event loop with
an `openai.AsyncOpenAI` client, a plain `def agent(client, row)` in a thread of its own with a blocking
`openai.OpenAI` client (`SyncAgents`).

Why a thread: the policy's endpoint is served in this same event loop (sampling/http_serve.InLoopServer). A blocking
client called on the loop (smolagents, langchain's `.invoke`, litellm, mini-swe-agent) waits for an answer that the
frozen loop can never send, until the request times out. In a thread, the loop keeps serving. A plain thread with no
event loop of its own (not envs/episode_threads.py's): sync frameworks call `asyncio.run` inside, which refuses to
run in a thread whose loop is running.

The timeout holds: an async agent is cancelled; a sync agent cannot be stopped (Python has no way to kill a thread),
so the rollout fails as timed out at once, the thread's client is closed (its next model call raises) and each of
its HTTP calls is bounded by the client's own timeout. The thread counts as stuck until it returns; at `max_stuck`
stuck threads a new sync rollout is refused (`SyncAgentsStuck`, its sample fails) rather than start yet another
thread the same code may block. A thread per rollout, not the loop's default executor: a stuck agent then cannot
starve the executor everything else shares.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
from collections.abc import Callable
from typing import Any

from posttrain.errors import PosttrainError


def is_async_agent(fn: Any) -> bool:
    """Whether calling `fn` gives a coroutine: an `async def` function or method, or a callable object whose
    `__call__` is one, also behind any `functools.partial`."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    if inspect.iscoroutinefunction(fn):
        return True
    if inspect.isroutine(fn) or inspect.isclass(fn):
        return False
    # A callable object: whether its __call__ is async (not whether it is callable, which B004 is about).
    return inspect.iscoroutinefunction(getattr(fn, "__call__", None))  # noqa: B004


class AgentIsAsync(PosttrainError, TypeError):
    """A plain function returned a coroutine: it wraps an async agent (a lambda, a decorator) and was run as a sync
    one, with the blocking client."""

    fix = "declare the function you pass to AgentEnv `async def`, or pass the async agent itself"

    def __init__(self) -> None:
        super().__init__(f"the agent function is a plain function that returned a coroutine: {self.fix}")


class SyncAgentsStuck(PosttrainError):
    fix = (
        "the sync agent blocks past AgentEnv's timeout_s (a call without a timeout, a sleep, a hang): bound its "
        "blocking calls, or raise timeout_s"
    )


class SyncAgents:
    """Runs sync agents, each in a daemon thread of its own; refuses new ones while `max_stuck` threads still run
    past their timeout (see the module docstring)."""

    def __init__(self, max_stuck: int = 8):
        self.max_stuck = max_stuck
        self._lock = threading.Lock()
        self._stuck = 0

    @property
    def stuck(self) -> int:
        """Threads still running an agent past its timeout."""
        return self._stuck

    async def run(self, fn: Callable[[Any, Any], Any], client: Any, row: Any, timeout_s: float) -> Any:
        """`fn(client, row)` in a thread; its result, or TimeoutError after `timeout_s` (`client` is closed
        either way, so a thread still running fails on its next call)."""
        with self._lock:
            if self._stuck >= self.max_stuck:
                client.close()
                raise SyncAgentsStuck(
                    f"{self._stuck} sync agent threads are still running past their timeout (the cap, max_stuck="
                    f"{self.max_stuck}): no new sync agent starts until one returns"
                )
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Any] = loop.create_future()
        state = {"stuck": False, "finished": False}  # under self._lock: the thread and the loop both read them

        def settle(result: Any, error: BaseException | None) -> None:
            if done.done():  # timed out meanwhile
                return
            if error is not None:
                done.set_exception(error)
            else:
                done.set_result(result)

        def work() -> None:
            result, error = None, None
            try:
                result = fn(client, row)
                if inspect.isawaitable(result):
                    if inspect.iscoroutine(result):
                        result.close()  # never awaited: no "coroutine was never awaited" warning
                    result, error = None, AgentIsAsync()
            except BaseException as e:  # noqa: BLE001 - whatever the agent raised is its rollout's error, on the loop
                error = e
            with self._lock:
                state["finished"] = True
                if state["stuck"]:
                    self._stuck -= 1
            try:
                loop.call_soon_threadsafe(settle, result, error)
            except RuntimeError:  # the loop closed while the agent ran: nobody waits for it
                pass

        threading.Thread(target=work, name="posttrain-sync-agent", daemon=True).start()
        try:
            return await asyncio.wait_for(done, timeout_s)
        except BaseException:  # the timeout, or the caller's cancellation: the thread runs on, counted as stuck
            with self._lock:
                if not state["finished"]:
                    state["stuck"] = True
                    self._stuck += 1
            raise
        finally:
            client.close()
