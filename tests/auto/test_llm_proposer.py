"""The LLM proposer through the openai client and a fake OpenAI-compatible endpoint (httpx.MockTransport):
a good diff is run with its reason; bad JSON, a frozen key, an unknown key or an out-of-range value is rejected,
counted, and Optuna proposes instead."""

import json

import pytest

pytest.importorskip("optuna")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

from posttrain.auto.program import load_program  # noqa: E402
from posttrain.auto.proposers import LLMProposer, OptunaProposer, parse_llm_diff, ProposalRejected  # noqa: E402


def fake_client(answers, seen):
    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append(body)
        text = answers.pop(0)
        return httpx.Response(200, json={
            "id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}]})
    return openai.OpenAI(base_url="http://fake.local/v1", api_key="k",
                         http_client=httpx.Client(transport=httpx.MockTransport(handler)))


@pytest.fixture
def prog(write_program):
    p, b = write_program(proposer={"kind": "llm", "model": "fake-model", "base_url": "http://fake.local/v1"},
                         search={"trainer.lr": {"low": 1e-6, "high": 1e-3, "log": True},
                                 "algorithm.name": {"choices": ["grpo", "rloo"]}})
    return load_program(p, b)


def test_llm_diffs_and_rejections(prog, tmp_path):
    answers = ['```json\n{"diff": {"trainer.lr": 5e-5}, "reason": "the baseline lr looks too low"}\n```',
               "I think you should raise the learning rate.",
               '{"diff": {"model.name": "default"}, "reason": "a bigger model"}',
               '{"diff": {"trainer.lr": 0.5}, "reason": "go big"}',
               '{"diff": {"trainer.lrr": 1e-4}, "reason": "typo"}']
    seen = []
    llm = LLMProposer(prog, OptunaProposer(prog, tmp_path), client=fake_client(answers, seen))
    incumbent = {"trainer.lr": 2e-5, "algorithm.name": "grpo"}
    llm.baseline(incumbent, 0.5)
    p = llm.propose(incumbent, "trial\tstatus\n0\tok\n")
    assert p.source == "llm" and p.params == {"trainer.lr": 5e-5, "algorithm.name": "grpo"}
    assert p.reason == "the baseline lr looks too low"
    llm.finish(p, 0.6, "complete")
    # the model saw program.md, the search space and results.tsv
    user = seen[0]["messages"][1]["content"]
    assert "some prose" in user and "trainer.lr: float in [1e-06, 0.001] (log scale)" in user and "0\tok" in user
    reasons = []
    for _ in range(4):
        q = llm.propose(incumbent, "")
        assert q.source == "optuna (llm rejected)" and prog.search["trainer.lr"].contains(q.params["trainer.lr"])
        reasons.append(q.reason)
        llm.finish(q, 0.4, "complete")
    assert llm.rejected == 4
    assert "no JSON object" in reasons[0] and "'model.name' is frozen" in reasons[1]
    assert "outside the search space" in reasons[2] and "not in the search space" in reasons[3]
    # the study saw every trial, the LLM's included
    assert len(llm.fallback.study.trials) == 6


def test_endpoint_down_falls_back(prog, tmp_path):
    def handler(request):
        return httpx.Response(500, json={"error": {"message": "down"}})
    client = openai.OpenAI(base_url="http://fake.local/v1", api_key="k", max_retries=0,
                           http_client=httpx.Client(transport=httpx.MockTransport(handler)))
    llm = LLMProposer(prog, OptunaProposer(prog, tmp_path), client=client)
    q = llm.propose({"trainer.lr": 2e-5, "algorithm.name": "grpo"}, "")
    assert llm.rejected == 1 and "endpoint error" in q.reason


def test_parse_llm_diff_cases(prog):
    inc = {"trainer.lr": 2e-5, "algorithm.name": "grpo"}
    params, reason = parse_llm_diff('{"diff": {"algorithm.name": "rloo"}, "reason": "r"}', prog, inc)
    assert params == {"trainer.lr": 2e-5, "algorithm.name": "rloo"} and reason == "r"
    for bad in ['{"diff": {}}', '{"diff": {"algorithm.name": "ppo"}}', "{not json}", '["a"]']:
        with pytest.raises(ProposalRejected):
            parse_llm_diff(bad, prog, inc)
