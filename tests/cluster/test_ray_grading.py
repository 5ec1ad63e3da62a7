"""cluster.sandbox=ray: sandboxed runs and grading as Ray tasks spread over two (simulated) nodes; results equal
in-process grading, a hung run times out, a dead worker and a grader's own error fail only their sample, and a
training run's sandboxed grading goes through Ray."""

import asyncio
import os
import time

import pytest

from posttrain.cluster.ray_grading import RayGrading, start_grading
from posttrain.config import load_config
from posttrain.config.schema import ClusterConfig
from posttrain.loop import train
from posttrain.obs import read_metrics
from posttrain.sandbox import SandboxConfig, SandboxPool
from posttrain.sandbox.pool import ThreadExecutor, current_executor
from posttrain.sandbox.tools import SandboxUnavailable, tool

CASES = [{"args": [2], "expected": 4}, {"args": [3], "expected": 9}, {"args": [0], "expected": 0}]
GOOD, WRONG = "def sq(x):\n    return x * x\n", "def sq(x):\n    return x + x\n"
CC = ClusterConfig(sandbox="ray", address="auto", grader_num_cpus=1, grade_timeout_s=120, grade_retries=1)


def _grade(pool, jobs):
    async def go():
        return await pool.grade_many(jobs)
    return asyncio.run(go())


def test_grading_on_two_nodes_equals_grading_here(two_nodes):
    jobs = [(GOOD, "sq", CASES), (WRONG, "sq", CASES), ("def sq(x):\n    while True: pass\n", "sq", CASES)] * 3
    cfg = SandboxConfig(timeout_s=5.0, concurrency=4)
    here = _grade(SandboxPool(cfg), jobs)
    with RayGrading.start(CC) as g:
        assert current_executor() is g  # installed for the block
        there = _grade(SandboxPool(cfg), jobs)  # a pool built without knowing about Ray follows the executor
        m = g.drain_metrics()
    assert isinstance(current_executor(), ThreadExecutor)  # and removed after it
    assert [(r.score, r.passed, r.total) for r in there] == [(r.score, r.passed, r.total) for r in here]
    assert [r.score for r in there[:3]] == [1.0, pytest.approx(2 / 3), 0.0]  # x + x is right for 2 and 0
    assert m["cluster/grade_calls"] == len(jobs) and m["cluster/grade_errors"] == 0
    assert m["cluster/grade_nodes"] == 2, m  # spread: both nodes graded
    assert two_nodes.is_initialized()  # the caller's Ray stays up


def test_a_hung_run_times_out_and_fails_only_its_sample(two_nodes):
    cc = CC.model_copy(update={"grade_timeout_s": 3.0})
    with RayGrading.start(cc) as g:
        t0 = time.perf_counter()
        with pytest.raises(TimeoutError, match="grade_timeout_s"):
            asyncio.run(g.call(time.sleep, 60))
        assert time.perf_counter() - t0 < 30
        assert g.drain_metrics()["cluster/grade_timeouts"] == 1


def test_errors_come_back_as_themselves_and_a_dead_worker_fails_its_sample(two_nodes):
    with RayGrading.start(CC) as g:
        with pytest.raises(ValueError, match="invalid literal"):
            asyncio.run(g.call(int, "x"))  # the callee's own error, not Ray's wrapper
        with pytest.raises(SandboxUnavailable, match="not found"):
            asyncio.run(g.call(tool, "no-such-tool-here"))  # still stops a run, as it does in process
        pool = SandboxPool(SandboxConfig(timeout_s=5.0))

        async def dead_then_good():
            dead = await pool._grade(os._exit, 3)  # the worker process dies (retried once, dies again)
            good = await pool.grade_function(GOOD, "sq", CASES)
            return dead, good
        dead, good = asyncio.run(dead_then_good())
        assert dead.score == 0.0 and "grading failed" in dead.error, dead.error
        assert good.score == 1.0  # the pool is still usable after a worker died
        assert g.drain_metrics()["cluster/grade_errors"] == 3


def test_local_sandbox_needs_no_ray():
    assert start_grading(ClusterConfig()) is None


def test_a_run_grades_its_code_on_ray(tmp_path, two_nodes):
    cfg = load_config(None, ["model.name=tiny-random", "model.threads=1", "task.name=code-tests", "loop.steps=1",
                             "loop.prompts_per_step=2", "algorithm.num_generations=2", "loop.eval_prompts=2",
                             "loop.eval_before=false", "logging.tensorboard=false", "logging.console=false",
                             "loop.save_every=0", "cluster.sandbox=ray", "cluster.address=auto",
                             "cluster.grade_timeout_s=120", f"run.output_dir={tmp_path}"])
    res = train(cfg)
    (rec,) = [r for r in read_metrics(str(res.run_dir)) if r["kind"] == "train"]
    # The env check's reference solutions (and any code the tiny model wrote) were graded as Ray tasks.
    assert rec["cluster/grade_calls"] >= 1 and rec["cluster/grade_errors"] == 0, rec
    assert isinstance(current_executor(), ThreadExecutor)
    assert two_nodes.is_initialized()
