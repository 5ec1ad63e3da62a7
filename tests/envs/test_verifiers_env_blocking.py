"""A verifiers (v1) env whose code blocks its thread (envs/verifiers_env.py, envs/episode_threads.py).

The env here has a reward that blocks for 30 s: `time.sleep` (a synchronous call inside an `async` reward, as a
sync HTTP client is) or a CPU-bound loop. Each episode runs on a thread with an event loop of its own, so the
blocked one fails as timed out at about `timeout_s`, while a well-behaved episode started during the block, and the
token-capturing endpoint it calls, carry on. The reward ends early once a file exists (the test's cleanup), so no
thread outlives the test.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest
from posttrain.envs.scoring import scored_by

vf = pytest.importorskip("verifiers.v1")
pytest.importorskip("fastapi")

THIS_FILE = __file__
BLOCK_S = 30.0


class BlockData(vf.TaskData):
    answer: str = "3"
    block: str = ""  # "sleep": time.sleep in the reward; "spin": a CPU-bound loop; "": a well-behaved reward
    started: str = ""  # a file the reward creates once it blocks
    release: str = ""  # a file whose existence ends the block early


class BlockTask(vf.Task[BlockData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def right(self, task: BlockData, trace: vf.Trace) -> float:
        if task.block:
            _block(task)
        return float(trace.last_reply.strip() == task.answer)


def _block(task: BlockData) -> None:
    """Blocks the calling thread for BLOCK_S (not the event loop's way: no await), or until `task.release`."""
    Path(task.started).touch()
    end = time.monotonic() + BLOCK_S
    released = Path(task.release).exists
    if task.block == "sleep":
        while time.monotonic() < end and not released():
            time.sleep(0.05)
        return
    n = 0
    while time.monotonic() < end:
        n += 1
        if n % 50_000 == 0 and released():
            return


class BlockSet(vf.Taskset[BlockTask, vf.TasksetConfig]):
    rows: list[dict] = [{}]

    def load(self):
        for r in self.rows:
            yield BlockTask(BlockData(prompt="Reply with the number 3.", **r), self.config.task)


def load_blocking(rows: list[dict] | None = None):
    taskset = BlockSet(vf.TasksetConfig())
    taskset.rows = rows or [{}]
    return taskset


# ---- helpers ------------------------------------------------------------------------------------------------------


def _load(**options):
    from posttrain.tasks.load import load_task

    return load_task(f"verifiers:{THIS_FILE}:load_blocking", options)


@pytest.fixture(scope="module")
def tok():
    from posttrain.models.tiny import tiny_tokenizer

    return tiny_tokenizer()


def _episode_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("posttrain-verifiers")]


def _wait_until(cond, limit_s: float) -> bool:
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


# ---- a blocking reward fails its own sample, at about timeout_s --------------------------------------------------


@pytest.mark.parametrize("kind", ["sleep", "spin"])
def test_a_blocking_reward_times_out_alone(kind, tok, tmp_path):
    """Before: the reward blocked the collector's loop for the whole 30 s (timeout_s could not fire, the other
    episode and the endpoint waited). Now: its episode fails as timed out within seconds, and an episode started
    while it still blocks runs to a pass."""
    from posttrain.envs.base import make_env
    from posttrain.sampling.scripted import ScriptedSampler
    from posttrain.types import SampleParams

    started, release = tmp_path / "started", tmp_path / "release"
    blocking_row = {"block": kind, "started": str(started), "release": str(release)}
    task = _load(rows=[blocking_row, {}], timeout_s=2)
    rows = task.train_rows + task.eval_rows
    blocking = next(r for r in rows if r["verifiers_task"].get("block"))
    plain = next(r for r in rows if not r["verifiers_task"].get("block"))
    params = SampleParams(max_tokens=8)
    env = make_env(task, tok, params)
    sampler = ScriptedSampler(tok, ["3"])
    before = set(_episode_threads())

    async def go():
        t0 = time.perf_counter()
        stuck = asyncio.ensure_future(env.rollout(blocking, sampler, params))
        while not started.exists() and time.perf_counter() - t0 < 20:
            await asyncio.sleep(0.05)
        t_ok = time.perf_counter()
        ok = await env.rollout(plain, sampler, params)  # while the other reward still blocks
        ok_s = time.perf_counter() - t_ok
        bad = await stuck
        bad_s = time.perf_counter() - t0
        ok, bad = await scored_by(env, [ok, bad])
        await env.close()
        return ok, ok_s, bad, bad_s

    try:
        ok, ok_s, bad, bad_s = asyncio.run(go())
        still_blocking = not release.exists() and started.exists()
    finally:
        release.touch()  # ends the block: the thread it holds returns and exits
    print(f"{kind}: blocked episode failed after {bad_s:.1f}s, the other took {ok_s:.1f}s")
    assert bad_s < 20, f"the blocked episode took {bad_s:.1f}s: timeout_s=2 did not bound it"
    assert bad.failed and "timed out after 2.0s" in bad.error, bad.error
    assert not ok.failed and ok.passed and ok.reward == 1.0, ok.error
    assert ok_s < 15 and still_blocking
    assert bad.metrics["verifiers/timed_out"] == 1.0 and ok.metrics["verifiers/timed_out"] == 0.0  # the step's record
    # The blocked thread was left behind (a sleeping thread cannot be killed); once its call returns it exits.
    assert _wait_until(lambda: not (set(_episode_threads()) - before), 15), _episode_threads()


def test_an_env_dropped_without_close_stops_its_threads(tok):
    """The training loop does not close its envs: an env that is garbage collected stops its idle threads."""
    import gc

    from posttrain.envs.base import make_env
    from posttrain.sampling.scripted import ScriptedSampler
    from posttrain.types import SampleParams

    task = _load(rows=[{}], timeout_s=30)
    params = SampleParams(max_tokens=8)
    env = make_env(task, tok, params)
    before = set(_episode_threads())

    async def go(e):
        return await e.rollout(task.train_rows[0], ScriptedSampler(tok, ["3"]), params)

    t = asyncio.run(go(env))
    assert not t.failed, t.error
    assert set(_episode_threads()) - before  # its thread waits for the next episode
    del env
    gc.collect()
    assert _wait_until(lambda: not (set(_episode_threads()) - before), 15), _episode_threads()
