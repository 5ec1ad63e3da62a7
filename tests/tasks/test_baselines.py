"""Repair tasks' baselines (tasks/baselines.py, issue #42): the untouched code's per-test grade is kept only when it
came to a verdict, graded up front by Task.prepare, retried on request, and a sample whose baseline is unknown
fails with the reason instead of being paid against a guess.

The defect these pin down: a baseline grade that timed out under CPU contention came back as "every test failed"
and was cached, so untouched code earned issue_tests 0.5 and more for the rest of the run."""

from __future__ import annotations

import asyncio

import pytest
from coding_agent_helpers import needs_sandbox

from posttrain.tasks import baselines as B
from posttrain.tasks.coding_agent.task import Grader, episode_factory, make_task as coding_task
from posttrain.envs.task import prepare_task
from posttrain.tasks import feature_deletion as F
from posttrain.sandbox import GradeResult, SandboxConfig, SandboxPool
from posttrain.sandbox.grading import static_test_ids

STYLES = ["unknown", "all-failed"]  # what grade_pytest reports for a starved run now / what it reported before


def starved(tests: dict[str, str], style: str) -> GradeResult:
    """A grade cut short by the run's timeout: per_test None (unknown), or every test 'failed' as before."""
    ids = sorted({t for rel, src in tests.items() for t in static_test_ids(rel, src)})
    return GradeResult(score=0.0, passed=0, total=len(ids), per_case=[False] * len(ids), isolation="bwrap",
                       error="result channel rejected (timed out): no closing record", timed_out=True,
                       per_test=None if style == "unknown" else {t: False for t in ids})


class StarvingPool:
    """The task's real pool, except that the grades `starve(call number, files)` picks time out."""

    def __init__(self, real: SandboxPool, style: str, starve) -> None:
        self.real, self.style, self.starve, self.calls = real, style, starve, 0

    async def grade_pytest(self, files, test_files, cfg=None, mode=None):
        self.calls += 1
        if self.starve(self.calls, files):
            return starved(test_files, self.style)
        return await self.real.grade_pytest(files, test_files, cfg, mode)


def _score(task_or_rubric, rows, texts):
    rubric = getattr(task_or_rubric, "rubric", task_or_rubric)
    return rubric.score([[{"role": "assistant", "content": t}] for t in texts],
                        [{k: v for k, v in r.items() if k != "prompt"} for r in rows])


def _stub_answer(row) -> str:
    """The deleted function handed back as it is: untouched code."""
    site = next(s for s in F.function_sites(row["files"][row["path"]]) if s.qualname == row["qualname"])
    return f"```python\n{F.original_function(row['files'][row['path']], site)}```"


# ---- not cached on a timeout; the next request regrades ---------------------------------------------------------


@needs_sandbox
@pytest.mark.parametrize("style", STYLES)
def test_feature_deletion_baseline_that_timed_out_is_regraded(style):
    grader = F.PytestGrader()
    grader.pool = pool = StarvingPool(grader.pool, style, lambda n, files: n == 1)
    row = F.make_task().train_rows[0]
    (first,) = grader.start([row])
    assert first.per_test is None and "timed out" in first.error
    (second,) = grader.start([row])  # not cached: graded again, and this time it came to a verdict
    assert pool.calls == 2 and second.per_test and not all(second.per_test.values())
    assert grader.start([row])[0].per_test == second.per_test and pool.calls == 2  # kept once it is a verdict


@needs_sandbox
@pytest.mark.parametrize("style", STYLES)
def test_coding_agent_baseline_that_timed_out_is_regraded(style):
    grader = Grader()
    grader.pool = pool = StarvingPool(grader.pool, style, lambda n, files: n == 1)
    row = next(r for r in coding_task().train_rows if r["kind"] == "bug")
    first = asyncio.run(grader.start(row))
    assert first.per_test is None and "timed out" in first.error
    second = asyncio.run(grader.start(row))
    assert pool.calls == 2 and second.per_test and not all(second.per_test.values())
    assert asyncio.run(grader.start(row)).per_test == second.per_test and pool.calls == 2


# ---- untouched code against an unknown baseline: 0 with an error, never paid ------------------------------------


@needs_sandbox
@pytest.mark.parametrize("style", STYLES)
def test_feature_deletion_untouched_code_against_an_unknown_baseline_fails_with_an_error(style):
    task = F.make_task()
    row = task.train_rows[0]
    grader = F.PytestGrader()
    # A baseline grades the row's own files dict (the rubric's `files` column); a sample grades a spliced copy.
    grader.pool = StarvingPool(grader.pool, style, lambda n, files: files is row["files"])
    (s,) = _score(F.deletion_rubric(grader), [row], [_stub_answer(row)])
    assert s.components["tests_passed"] > 0.5  # most of the repo's tests pass without the function
    assert s.failed and s.reward == 0.0 and s.components["issue_tests"] == 0.0 and not s.passed
    assert "baseline unknown" in s.error and "timed out" in s.error
    (logged,) = _score(F.deletion_rubric(grader, reward="tests_passed"), [row], [_stub_answer(row)])
    assert not logged.failed and logged.reward == logged.components["tests_passed"]  # only logged: no failure


@needs_sandbox
@pytest.mark.parametrize("style", STYLES)
def test_coding_agent_untouched_submission_against_an_unknown_baseline_fails_with_an_error(style):
    task = coding_task()
    row = next(r for r in task.eval_rows if r["kind"] == "bug")
    grader = Grader()
    # finish() grades the submitted state first (call 1), then asks for the baseline (every later call)
    grader.pool = StarvingPool(grader.pool, style, lambda n, files: n > 1)
    ep = episode_factory(grader)(row)
    ep.submit()
    end = asyncio.run(ep.finish({"name": "submit", "arguments": {}}))
    grade = end.columns["final_grade"]
    assert grade["start_per_test"] is None and "timed out" in grade["start_error"]
    (s,) = task.rubric.score([[{"role": "assistant", "content": ""}]],
                             [{**{k: v for k, v in row.items() if k != "prompt"}, **end.columns}])
    assert s.components["tests_passed"] > 0.3  # the untouched code passes a third or more of the tests
    assert s.failed and s.reward == 0.0 and s.components["issue_tests"] == 0.0 and not s.passed
    assert "baseline unknown" in s.error


def test_coding_agent_issue_tests_fails_only_the_samples_without_a_baseline():
    task = coding_task()
    row = {k: v for k, v in task.train_rows[0].items() if k != "prompt"}
    known = {"score": 1.0, "passed": 2, "total": 2, "trust": "out-of-process", "error": None,
             "per_test": {"t::a": True, "t::b": True}, "start_per_test": {"t::a": False, "t::b": True}}
    unknown = {**known, "start_per_test": None, "start_error": "timed out (try 1 of 3)"}
    a, b, c = task.rubric.score([[{"role": "assistant", "content": ""}]] * 3, [
        {**row, "final_grade": known, "final_files": row["files"]},
        {**row, "final_grade": unknown, "final_files": row["files"]},
        {**row, "final_grade": None, "final_files": row["files"]}])  # not submitted: 0, nothing to measure
    assert a.reward == 1.0 and a.passed and not a.failed
    assert b.failed and b.reward == 0.0 and "baseline unknown" in b.error and "timed out" in b.error
    assert c.reward == 0.0 and not c.failed


# ---- graded up front, once ----------------------------------------------------------------------------------------


@needs_sandbox
def test_prepare_grades_every_row_once_and_a_second_call_grades_nothing(monkeypatch):
    calls = []
    real = SandboxPool.grade_pytest

    async def counting(self, files, test_files, cfg=None, mode=None):
        calls.append(cfg.timeout_s if cfg is not None else None)
        return await real(self, files, test_files, cfg, mode)

    monkeypatch.setattr(SandboxPool, "grade_pytest", counting)
    task = F.make_task(repos=["inventory"], sandbox={"timeout_s": 7.0})
    rows = task.train_rows + task.eval_rows
    said: list[str] = []
    prepare_task(task, said.append)
    assert len(calls) == len(rows) and set(calls) == {21.0}  # every row, train and held-out, at 3x the timeout
    assert "graded" in said[-1] and f"{len(rows)} of {len(rows)} rows" in said[-1]
    prepare_task(task, said.append)
    assert len(calls) == len(rows)  # nothing left to grade
    (s,) = _score(task, [rows[-1]], [_stub_answer(rows[-1])])
    assert len(calls) == len(rows) + 1 and s.reward == 0.0 and not s.failed  # the sample's own grade only


# ---- the store's retry policy, without a sandbox ------------------------------------------------------------------


class ScriptedPool:
    """Baseline grades from a script: `starve[key]` tries of a row time out, then it comes to a verdict."""

    def __init__(self, starve: dict[str, int], style: str = "unknown") -> None:
        self.starve, self.style, self.calls = dict(starve), style, []

    async def grade_pytest(self, files, test_files, cfg=None, mode=None):
        key = files["key"]
        self.calls.append(key)
        if self.calls.count(key) <= self.starve.get(key, 0):
            return starved({"test_x.py": "def test_a(): pass\ndef test_b(): pass\n"}, self.style)
        return GradeResult(score=0.5, passed=1, total=2, per_case=[True, False], isolation="bwrap",
                           per_test={"test_x.py::test_a": True, "test_x.py::test_b": False})


def _subject(row):
    return {"key": row["id"]}, {}


def _id(row):
    return row["id"]


def _store(**kw) -> B.BaselineStore:
    return B.BaselineStore("t", SandboxConfig(timeout_s=2.0, cpu_s=3), _subject, _id, **kw)


@pytest.mark.parametrize("style", STYLES)
def test_prepare_retries_then_gives_up_once_and_requests_do_not_regrade(monkeypatch, style):
    pool = ScriptedPool({"slow": 1, "hung": 99}, style)
    monkeypatch.setattr("posttrain.sandbox.SandboxPool", lambda cfg: pool)
    store, said = _store(), []
    assert (store.cfg.timeout_s, store.cfg.cpu_s) == (6.0, 9)  # a baseline gets 3x the per-sample limits
    rows = [{"id": "ok"}, {"id": "slow"}, {"id": "hung"}, {"id": "ok"}]
    store.prepare(rows, said.append)
    assert sorted(pool.calls) == ["hung"] * 3 + ["ok", "slow", "slow"]  # one retry; three tries, then given up
    assert [line for line in said if "given up" in line] == [said[0]] and "hung" in said[0]
    assert "2 of 3 rows graded" in said[-1] and "1 unknown" in said[-1]
    hung = asyncio.run(store.get({"id": "hung"}, pool))
    assert hung.per_test is None and "given up" in hung.error and len(pool.calls) == 6  # no fourth try
    assert asyncio.run(store.get({"id": "slow"}, pool)).per_test == {"test_x.py::test_a": True,
                                                                     "test_x.py::test_b": False}
    store.prepare(rows, said.append)
    assert len(pool.calls) == 6


def test_requests_retry_one_try_each_and_log_the_give_up_once(caplog):
    pool, store = ScriptedPool({"hung": 99}), _store(max_tries=2)
    row = {"id": "hung"}
    first = asyncio.run(store.get(row, pool))
    assert first.per_test is None and "try 1 of 2" in first.error
    with caplog.at_level("ERROR", logger=B.__name__):
        asyncio.run(store.get(row, pool))
        asyncio.run(store.get(row, pool))
    assert pool.calls == ["hung", "hung"] and len(caplog.records) == 1 and "given up" in caplog.records[0].message


def test_the_store_survives_pickling_with_its_baselines():
    import pickle

    store = _store()
    asyncio.run(store.get({"id": "ok"}, ScriptedPool({})))
    copy = pickle.loads(pickle.dumps(store))  # Ray env workers get the task's episode factory pickled
    assert copy.cached({"id": "ok"}).per_test == store.cached({"id": "ok"}).per_test
