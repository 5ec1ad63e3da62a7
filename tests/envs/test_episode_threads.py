"""EpisodeThreads (envs/episode_threads.py): each episode on a thread with a loop of its own, so code that blocks
its thread times out alone; the stuck-thread cap, the running-thread cap, close(). No verifiers needed here
(tests/envs/test_verifiers_env_blocking.py drives it through a verifiers env)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from posttrain.envs.episode_threads import EpisodeThreads, EpisodeThreadsStuck

NAME = "posttrain-test-episode"


@contextlib.asynccontextmanager
async def _setup(log: list[str] | None = None):
    if log is not None:
        log.append("enter")
    try:
        yield threading.current_thread().name
    finally:
        if log is not None:
            log.append("exit")


def _ours() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(NAME)]


def _wait_until(cond, limit_s: float) -> bool:
    end = time.monotonic() + limit_s
    while time.monotonic() < end and not cond():
        time.sleep(0.02)
    return cond()


async def _await_until(cond, limit_s: float) -> bool:
    end = time.monotonic() + limit_s
    while time.monotonic() < end and not cond():
        await asyncio.sleep(0.02)
    return cond()


@pytest.fixture(autouse=True)
def _no_thread_left():
    yield
    assert _wait_until(lambda: not _ours(), 15), _ours()


async def _value(v: str) -> str:
    await asyncio.sleep(0.02)
    return v


@pytest.mark.parametrize("how", ["sleep", "spin"])
def test_a_job_blocking_its_thread_times_out_alone(how):
    release = threading.Event()

    async def blocking(_: str) -> str:
        if how == "sleep":
            release.wait(30)
        else:
            end = time.monotonic() + 30
            while time.monotonic() < end and not release.is_set():
                pass
        return "late"

    pool = EpisodeThreads(_setup, max_threads=4, max_stuck=2, name=NAME)

    async def go():
        t0 = time.perf_counter()
        stuck = asyncio.ensure_future(pool.run(blocking, 0.5))
        await asyncio.sleep(0.1)
        others = await asyncio.gather(*(pool.run(_value, 10) for _ in range(6)))  # while it blocks
        with pytest.raises(TimeoutError):
            await stuck
        took = time.perf_counter() - t0
        assert pool.stuck == 1 and not release.is_set()
        release.set()
        assert await _await_until(lambda: pool.stuck == 0, 10)  # it came back
        await pool.close()
        return others, took

    others, took = asyncio.run(go())
    assert took < 10 and all(v.startswith(NAME) for v in others)


def test_at_the_stuck_cap_new_jobs_fail_at_once_until_one_returns():
    release = threading.Event()

    async def blocking(_: str) -> None:
        release.wait(30)

    pool = EpisodeThreads(_setup, max_threads=4, max_stuck=1, name=NAME)

    async def go():
        with pytest.raises(TimeoutError):
            await pool.run(blocking, 0.3)
        t0 = time.perf_counter()
        with pytest.raises(EpisodeThreadsStuck, match="blocked past their timeout"):
            await pool.run(_value, 10)
        refused_s = time.perf_counter() - t0
        release.set()
        assert await _await_until(lambda: pool.stuck == 0, 10)
        value = await pool.run(_value, 10)  # the thread that came back is reused
        alive = pool.alive
        await pool.close()
        return refused_s, value, alive

    refused_s, value, alive = asyncio.run(go())
    assert refused_s < 10 and value == f"{NAME}-1" and alive == 1  # refused after the grace, not after the 30 s


def test_jobs_that_time_out_but_come_back_at_once_are_not_refused():
    """Many well-behaved (cancellable) jobs timing out together are stuck only for the moment their cancellation
    takes: a job started right then waits for them (briefly) instead of being refused at the cap."""

    async def hang(_: str) -> None:
        try:
            await asyncio.sleep(30)
        finally:
            await asyncio.sleep(0.3)  # its cleanup (a verifiers episode tears its rollout down)

    pool = EpisodeThreads(_setup, max_threads=8, max_stuck=1, name=NAME)

    async def go():
        outs = await asyncio.gather(*(pool.run(hang, 0.2) for _ in range(4)), return_exceptions=True)
        assert all(isinstance(o, TimeoutError) for o in outs)
        values = await asyncio.gather(*(pool.run(_value, 10) for _ in range(4)))
        await pool.close()
        return values

    assert len(asyncio.run(go())) == 4


def test_at_most_max_threads_jobs_run_at_once():
    running, peak, lock = [0], [0], threading.Lock()

    async def job(v: str) -> str:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        await asyncio.sleep(0.05)
        with lock:
            running[0] -= 1
        return v

    pool = EpisodeThreads(_setup, max_threads=2, max_stuck=1, name=NAME)

    async def go():
        out = await asyncio.gather(*(pool.run(job, 10) for _ in range(8)))
        await pool.close()
        return out

    out = asyncio.run(go())
    assert len(out) == 8 and peak[0] <= 2 and len(set(out)) <= 2


def test_a_cancelled_caller_cancels_its_job():
    ended = threading.Event()

    async def long(_: str) -> None:
        try:
            await asyncio.sleep(30)
        finally:
            ended.set()

    pool = EpisodeThreads(_setup, max_threads=2, max_stuck=2, name=NAME)

    async def go():
        task = asyncio.ensure_future(pool.run(long, 60))
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await _await_until(lambda: ended.is_set() and pool.stuck == 0, 10)
        await pool.close()

    asyncio.run(go())


def test_a_failed_setup_fails_its_job_and_the_next_thread_tries_again():
    calls = [0]

    @contextlib.asynccontextmanager
    async def flaky():
        calls[0] += 1
        if calls[0] == 1:
            raise RuntimeError("the env would not start")
        yield "ok"

    pool = EpisodeThreads(flaky, max_threads=2, max_stuck=1, name=NAME)

    async def go():
        with pytest.raises(RuntimeError, match="would not start"):
            await pool.run(_value, 10)
        value = await pool.run(_value, 10)
        await pool.close()
        return value

    assert asyncio.run(go()) == "ok" and calls[0] == 2


def test_close_leaves_each_setup_and_stops_the_threads():
    log: list[str] = []
    pool = EpisodeThreads(lambda: _setup(log), max_threads=3, max_stuck=1, name=NAME)

    async def go():
        await asyncio.gather(*(pool.run(_value, 10) for _ in range(3)))
        await pool.close()
        assert pool.alive == 0
        assert await pool.run(_value, 10)  # usable again: a fresh thread
        await pool.close()

    asyncio.run(go())
    assert log.count("enter") == log.count("exit") >= 2


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    plan=st.lists(st.tuples(st.integers(0, 3), st.booleans()), min_size=1, max_size=10),
    max_threads=st.integers(1, 3),
)
def test_every_job_not_cancelled_completes_whatever_the_order(plan, max_threads):
    """Jobs of random lengths, some of their callers cancelled while waiting or running: no wake-up is lost (every
    other job ends), no thread stays counted stuck, and at most max_threads jobs whose caller waits run at once."""
    running, peak, lock = [0], [0], threading.Lock()

    async def job(v: str, ticks: int, kept: bool) -> int:
        # Only jobs whose caller waits count: a cancelled one's thread is stuck (outside max_threads) until its
        # cancellation lands.
        with lock:
            running[0] += kept
            peak[0] = max(peak[0], running[0])
        try:
            await asyncio.sleep(0.01 * ticks)
        finally:
            with lock:
                running[0] -= kept
        return ticks

    pool = EpisodeThreads(_setup, max_threads=max_threads, max_stuck=len(plan) + 1, name=NAME)

    async def go():
        tasks = [asyncio.ensure_future(pool.run(lambda v, t=t, c=c: job(v, t, not c), 10)) for t, c in plan]
        await asyncio.sleep(0.015)
        for task, (_, cancel) in zip(tasks, plan):
            if cancel:
                task.cancel()
        done = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 20)
        settled = await _await_until(lambda: pool.stuck == 0, 10)
        await pool.close()
        return done, settled

    done, settled = asyncio.run(go())
    assert settled and peak[0] <= max_threads
    for (ticks, cancel), out in zip(plan, done):
        assert out == ticks or (cancel and isinstance(out, asyncio.CancelledError)), (ticks, cancel, out)
