"""The judge runner with an in-memory backend: cache, batching, retries, timeouts, partial failures, metrics."""

import time

import pytest

from judge_fakes import FakeBackend
from posttrain.envs.task import Task
from posttrain.rewards.judges import (JudgeCache, JudgeRunner, PairwiseJudge, PointwiseJudge, RankingJudge)
from posttrain.rewards.judges.errors import JudgeBadOutput, JudgeTimeout, JudgeUnavailable
from posttrain.rewards.rubric import RewardComponent, Rubric
from posttrain.rewards.telemetry import drain_task_metrics

Q = "Reply: {completion}\nWord: {word}\nDoes the reply use the word? Answer Yes or No."


def _runner(tmp_path, backend, **kw):
    return JudgeRunner(backend, JudgeCache(tmp_path / "c.sqlite"), backoff_s=0.0, **kw)


def test_pointwise_fills_columns_and_batches(tmp_path):
    b = FakeBackend()
    j = PointwiseJudge(_runner(tmp_path, b, batch_size=2), Q)
    assert j(["good a", "b", "good c"], word=["x", "y", "z"]) == [0.9, 0.1, 0.9]
    assert b.calls == 2 and "Word: y" in b.prompts_seen[1]


def test_template_errors_are_clear(tmp_path):
    with pytest.raises(ValueError, match="completion"):
        PointwiseJudge(_runner(tmp_path, FakeBackend()), "no fields here")
    j = PointwiseJudge(_runner(tmp_path, FakeBackend()), Q)
    with pytest.raises(ValueError, match="word"):
        j(["a"])  # the row has no `word` column


def test_cache_reuse_across_runs(tmp_path):
    b1 = FakeBackend()
    PointwiseJudge(_runner(tmp_path, b1), Q)(["good", "bad"], word=["w", "w"])
    b2 = FakeBackend(answer=lambda p: 0.5)  # a second run: new process, same judge id, same cache file
    j2 = PointwiseJudge(_runner(tmp_path, b2), Q)
    assert j2(["good", "bad"], word=["w", "w"]) == [0.9, 0.1]
    assert b2.calls == 0
    m = j2.drain_metrics()
    assert m["judge/cache_hit"] == 1.0 and m["judge/lookups"] == 2
    assert j2.drain_metrics()["judge/lookups"] == 0  # drained


def test_changed_template_or_judge_is_not_a_cache_hit(tmp_path):
    PointwiseJudge(_runner(tmp_path, FakeBackend()), Q)(["good"], word=["w"])
    b = FakeBackend(judge_id="fake:2")
    PointwiseJudge(_runner(tmp_path, b), Q)(["good"], word=["w"])
    assert b.calls == 1


def test_retries_bounded_and_partial_failure(tmp_path):
    bad_prompt = Q.format(completion="bad", word="w")
    b = FakeBackend(fail={bad_prompt: JudgeUnavailable("down for this one")})
    j = PointwiseJudge(_runner(tmp_path, b, max_retries=2), Q)
    out = j.score_all(["good", "bad"], word=["w", "w"])
    assert out[0] == 0.9 and isinstance(out[1], JudgeUnavailable)
    assert b.calls == 3  # the good prompt answered at once; only the failed one was retried, twice
    m = j.drain_metrics()
    assert m["judge/retries"] == 2 and m["judge/failures"] == 1


def test_malformed_score_is_final(tmp_path):
    b = FakeBackend(text=lambda p: "7/10" if "good" in p else "excellent!")
    j = PointwiseJudge(_runner(tmp_path, b, max_retries=3), "Rate {completion} from 0 to 10.", mode="score")
    out = j.score_all(["good", "meh"])
    assert out[0] == pytest.approx(0.7) and isinstance(out[1], JudgeBadOutput)
    assert b.calls == 1
    # The good answer was cached as text and re-parses on a hit.
    b2 = FakeBackend(text=lambda p: "0")
    assert PointwiseJudge(_runner(tmp_path, b2), "Rate {completion} from 0 to 10.", mode="score")(["good"]) == [0.7]


def test_whole_call_timeout(tmp_path):
    b = FakeBackend(sleep_s=1.0)
    j = PointwiseJudge(_runner(tmp_path, b, timeout_s=0.1, max_retries=1), Q)
    t0 = time.perf_counter()
    out = j.score_all(["good"], word=["w"])
    assert isinstance(out[0], JudgeTimeout) and time.perf_counter() - t0 < 0.9
    assert j.drain_metrics()["judge/timeouts"] == 2


def test_backend_bug_is_final_not_retried(tmp_path):
    b = FakeBackend(raise_all=ZeroDivisionError("bug"))
    out = PointwiseJudge(_runner(tmp_path, b, max_retries=3), Q).score_all(["x"], word=["w"])
    assert "ZeroDivisionError" in str(out[0]) and b.calls == 1


def test_rubric_fails_only_the_failed_samples(tmp_path):
    bad_prompt = Q.format(completion="bad", word="w")
    b = FakeBackend(fail={bad_prompt: JudgeBadOutput("garbage")})
    judge = PointwiseJudge(_runner(tmp_path, b), Q)
    rubric = Rubric([RewardComponent("judge", judge, pass_threshold=0.5)])
    s = rubric.score(["good", "bad"], [{"prompt": "p", "word": "w"}] * 2)
    assert not s[0].failed and s[0].reward == 0.9 and s[0].passed
    assert s[1].failed and "garbage" in s[1].error
    assert b.calls == 1  # no per-sample re-calls


def test_pairwise_counts_position_flips(tmp_path):
    # A judge that always prefers the first answer: every pair flips; P(a) cancels to 0.5.
    b = FakeBackend(answer=lambda p: 0.9)
    pj = PairwiseJudge(_runner(tmp_path, b), "A: {a}\nB: {b}\nIs A better? Answer Yes or No.")
    assert pj(["x", "y", "z"]) == pytest.approx([0.5, 0.5, 0.5])
    m = pj.drain_metrics()
    assert m["judge/pairs"] == 3 and m["judge/position_flips"] == 3 and m["judge/lookups"] == 6


def test_pairwise_ranks_the_better_completion(tmp_path):
    b = FakeBackend(answer=lambda p: 0.8 if p.split("\n")[0].endswith("good") else 0.2)
    pj = PairwiseJudge(_runner(tmp_path, b), "A: {a}\nB: {b}\nIs A better? Answer Yes or No.")
    s = pj(["good", "bad"])
    assert s[0] > s[1] and pj.drain_metrics()["judge/position_flips"] == 0


def test_ranking_group_reward_and_malformed(tmp_path):
    b = FakeBackend(text=lambda p: "2 > 3 > 1")
    rj = RankingJudge(_runner(tmp_path, b))
    assert rj(["a", "b", "c"], prompts=["q"] * 3) == [0.0, 1.0, 0.5]
    rj_bad = RankingJudge(_runner(tmp_path, FakeBackend(text=lambda p: "all great")), name="r2",
                          question="{candidates} rank them please")
    with pytest.raises(JudgeBadOutput):
        rj_bad(["a", "b"])


def test_drain_task_metrics_merges_judges(tmp_path):
    j1 = PointwiseJudge(_runner(tmp_path, FakeBackend()), Q)
    j2 = PairwiseJudge(_runner(tmp_path, FakeBackend(judge_id="fake:p")), "A: {a}\nB: {b}\nA better?")
    task = Task("t", [{"prompt": "p", "word": "w"}], [], Rubric([RewardComponent("judge", j1)]), group_rewards=[j2])
    j1(["good", "good"], word=["w", "w"])  # the duplicate is a miss once, then... asked once
    j2(["x", "y"])
    m = drain_task_metrics(task)
    assert m["judge/lookups"] == 4 and m["judge/pairs"] == 1
    assert m["judge/cache_hit"] == 0.0 and "judge/latency" in m
    assert drain_task_metrics(task)["judge/lookups"] == 0
    assert drain_task_metrics(Task("t", [{"prompt": "p"}], [], Rubric([]))) == {}
