"""The OpenAI-compatible judge backend against a fake server: every failure path, no network."""

import time

import pytest

from judge_fakes import FakeJudgeServer, free_port
from posttrain.rewards.judges import JudgeCache, JudgeRunner, OpenAIBackend, PointwiseJudge
from posttrain.rewards.judges.errors import JudgeBadOutput, JudgeTimeout, JudgeUnavailable
from posttrain.rewards.rubric import RewardComponent, Rubric

Q = "Reply: {completion}\nIs the reply fine? Answer Yes or No."


def _judge(url, tmp_path, **runner_kw):
    backend = OpenAIBackend(url, timeout_s=runner_kw.pop("http_timeout_s", 5.0))
    runner = JudgeRunner(backend, JudgeCache(tmp_path / "c.sqlite"), backoff_s=0.01, **runner_kw)
    return PointwiseJudge(runner, Q)


def test_logprobs_give_graded_yes_probability(tmp_path):
    with FakeJudgeServer("logprobs") as srv:
        j = _judge(srv.url, tmp_path)
        assert j(["a good one", "bad"]) == pytest.approx([0.8, 0.2])
        assert j.runner.backend.model == "fake-judge"  # taken from /v1/models


def test_text_answer_when_the_server_gives_no_logprobs(tmp_path):
    with FakeJudgeServer("text") as srv:
        assert _judge(srv.url, tmp_path)(["good", "bad"]) == [1.0, 0.0]


def test_malformed_output_fails_only_and_is_not_retried(tmp_path):
    with FakeJudgeServer("malformed") as srv:
        j = _judge(srv.url, tmp_path, max_retries=3)
        out = j.score_all(["good", "bad"])
        assert all(isinstance(o, JudgeBadOutput) for o in out)
        assert srv.requests == 2  # one request per prompt, no retries of a deterministic bad answer
        assert j.drain_metrics()["judge/failures"] == 2


def test_endpoint_down_connection_refused(tmp_path):
    url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    j = _judge(url, tmp_path, max_retries=2)
    t0 = time.perf_counter()
    out = j.score_all(["good", "bad"])
    assert all(isinstance(o, JudgeUnavailable) for o in out)
    assert "cannot connect" in str(out[0])
    m = j.drain_metrics()
    assert m["judge/calls"] == 3 and m["judge/retries"] == 4 and m["judge/failures"] == 2  # 1 + 2 retries
    assert time.perf_counter() - t0 < 10


def test_timeout_is_bounded_and_retried_a_bounded_number_of_times(tmp_path):
    with FakeJudgeServer("slow", sleep_s=3.0) as srv:
        j = _judge(srv.url, tmp_path, max_retries=1, http_timeout_s=0.3)
        t0 = time.perf_counter()
        out = j.score_all(["good"])
        assert isinstance(out[0], JudgeTimeout)
        assert time.perf_counter() - t0 < 2.5  # 2 attempts x 0.3 s (+ backoff), never the server's 3 s
        m = j.drain_metrics()
        assert m["judge/timeouts"] == 2 and m["judge/failures"] == 1


def test_runner_timeout_backstops_a_hung_backend_call(tmp_path):
    with FakeJudgeServer("slow", sleep_s=3.0) as srv:
        j = _judge(srv.url, tmp_path, max_retries=0, http_timeout_s=30, timeout_s=0.3)
        t0 = time.perf_counter()
        assert isinstance(j.score_all(["good"])[0], JudgeTimeout)
        assert time.perf_counter() - t0 < 2.0


def test_http_500_is_retried_then_answers(tmp_path):
    with FakeJudgeServer("flaky", flaky_failures=1) as srv:
        j = _judge(srv.url, tmp_path, max_retries=2)
        assert j(["good"]) == pytest.approx([0.8])
        assert srv.requests == 2
        assert j.drain_metrics()["judge/retries"] == 1


def test_retries_are_bounded_on_persistent_500(tmp_path):
    with FakeJudgeServer("error500") as srv:
        j = _judge(srv.url, tmp_path, max_retries=2)
        assert isinstance(j.score_all(["good"])[0], JudgeUnavailable)
        assert srv.requests == 3


def test_cache_reuse_across_runs_makes_no_calls(tmp_path):
    with FakeJudgeServer("logprobs") as srv:
        first = _judge(srv.url, tmp_path)(["good", "bad", "good"])
        n = srv.requests
        assert n == 2  # the duplicate is asked once
        # A second run: a new judge object, same cache file.
        j2 = _judge(srv.url, tmp_path)
        assert j2(["good", "bad", "good"]) == first
        assert srv.requests == n
        m = j2.drain_metrics()
        assert m["judge/cache_hit"] == 1.0 and m["judge/calls"] == 0


def test_failed_call_fails_only_its_samples_in_a_rubric(tmp_path):
    """Endpoint down for one judge: its samples fail; the rubric's other component still scores them, and
    nothing raises out of the rubric."""
    url = f"http://127.0.0.1:{free_port()}/v1"
    judge = _judge(url, tmp_path, max_retries=0)
    rubric = Rubric([RewardComponent("exact", lambda cs, **k: [1.0 if c == "good" else 0.0 for c in cs]),
                     RewardComponent("judge", judge, weight=0.5)], pass_component="exact")
    scores = rubric.score(["good", "bad"], [{"prompt": "p"}, {"prompt": "p"}])
    assert all(s.failed and "judge" in s.error for s in scores)
    assert judge.runner.backend  # the rubric did not call the judge per sample after the batch failed
    assert judge.drain_metrics()["judge/calls"] == 1
