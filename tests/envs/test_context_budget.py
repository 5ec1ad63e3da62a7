"""The context budget (sampling/context.py): every prompt + max_tokens within the model's context, one rule for every
sampler; a prompt that cannot fit fails alone; multi-turn episodes that outgrow the context end with a context stop
and are trained on as truncated; tool results and observations are bounded before they are tokenized.

The vLLM engines run the same scenario (tests/context_episodes.py) in tests/sampling/test_vllm_engine.py and
tests/cluster/test_vllm_servers.py."""

from __future__ import annotations

import asyncio
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from context_episodes import check_scenario, run_scenario
from posttrain.bounded import truncate_text
from posttrain.envs.isolate import safe_rollout
from posttrain.envs.task import Task
from posttrain.envs.tool_env import ToolEnv
from posttrain.rewards.rubric import RewardComponent, Rubric
from posttrain.sampling.coalesce import Coalescer
from posttrain.sampling.context import ContextBudget, ContextOverflow, budget_for
from posttrain.sampling.hf_sampler import HFSampler
from posttrain.sampling.scripted import ScriptedSampler
from posttrain.types import Completion, SampleParams
from posttrain.envs.scoring import scored_by


# ---- the rule ------------------------------------------------------------------------------------------------------
def test_fit_keeps_what_fits_cuts_under_truncate_and_refuses_otherwise():
    fail, cut = ContextBudget(100), ContextBudget(100, overflow="truncate", min_new_tokens=16)
    assert fail.fit(60, 40) == 40 and cut.fit(60, 40) == 40
    with pytest.raises(ContextOverflow, match="60 tokens \\+ max_tokens 41 exceeds the model's context of 100"):
        fail.fit(60, 41)
    assert cut.fit(60, 64) == 40
    with pytest.raises(ContextOverflow):
        cut.fit(90, 64)  # 10 left: under the 16-token minimum
    assert cut.fit(95, 4) == 4
    with pytest.raises(ContextOverflow):
        cut.fit(97, 4)  # an ask below the minimum is not cut at all


@given(st.integers(2, 10_000), st.integers(0, 20_000), st.integers(1, 20_000), st.sampled_from(["fail", "truncate"]))
def test_fit_never_returns_more_than_the_room(limit, prompt, ask, overflow):
    b = ContextBudget(limit, overflow=overflow)
    try:
        got = b.fit(prompt, ask)
    except ContextOverflow:
        assert prompt + ask > limit
        return
    assert 1 <= got <= ask and prompt + got <= limit
    assert got == ask or overflow == "truncate"


def test_the_budget_is_the_smallest_of_model_config_and_engine():
    class Cfg:
        max_position_embeddings = 2048

    assert budget_for(Cfg()).max_context == 2048
    assert budget_for(Cfg(), max_context=1000).max_context == 1000
    assert budget_for(Cfg(), max_context=1000, engine_limit=512).max_context == 512
    assert budget_for(object()).max_context == 4096  # a config that names no limit


# ---- one caller fails alone -----------------------------------------------------------------------------------------
def test_a_coalesced_caller_past_the_context_fails_alone():
    served: list[list[list[int]]] = []

    async def sample_rows(rows, params):
        if any(len(r) + params.max_tokens > 50 for r in rows):  # what vLLM does: the whole call refused
            raise ValueError("the engine refused the whole call")
        served.append(rows)
        return [Completion([1], [0.0], "stop", 0) for _ in rows]

    co = Coalescer(sample_rows, ContextBudget(50))

    async def go():
        return await asyncio.gather(co.sample([[1] * 10], SampleParams(max_tokens=8), n=2),
                                    co.sample([[2] * 45], SampleParams(max_tokens=8)),
                                    co.sample([[3] * 20], SampleParams(max_tokens=8), n=3),
                                    return_exceptions=True)

    ok1, bad, ok2 = asyncio.run(go())
    assert isinstance(bad, ContextOverflow) and bad.prompt_tokens == 45
    assert [len(g) for g in ok1] == [2] and [len(g) for g in ok2] == [3]
    assert len(served) == 1 and len(served[0]) == 5  # one batch, without the long row


def test_the_own_sampler_never_decodes_past_the_models_positions(tiny):
    model, tok = tiny
    sampler = HFSampler(model, tok, [tok.eos_token_id], seed=0)
    positions = model.config.max_position_embeddings
    assert sampler.context.max_context == positions
    prompt = [5] * (positions - 20)
    with pytest.raises(ContextOverflow, match=f"context of {positions} tokens"):
        asyncio.run(sampler.sample([prompt], SampleParams(max_tokens=100)))
    with pytest.raises(ContextOverflow):
        sampler.sample_sync([prompt], SampleParams(max_tokens=100))
    (c,), = sampler.sample_sync([prompt], SampleParams(max_tokens=20, temperature=0.0))
    assert len(c.token_ids) <= 20
    cut = HFSampler(model, tok, [tok.eos_token_id], seed=0,
                    context=ContextBudget(positions, overflow="truncate"))
    (c,), = cut.sample_sync([prompt], SampleParams(max_tokens=100, temperature=1.0))
    assert len(prompt) + len(c.token_ids) <= positions


def test_own_sampler_multi_turn_episodes_stop_at_the_context_and_are_trained(tiny):
    model, tok = tiny
    budget = 300
    sampler = HFSampler(model, tok, [tok.eos_token_id], seed=0, prefix_cache_tokens=4096,
                        context=ContextBudget(budget))
    check_scenario(run_scenario(sampler, tok), budget)


# ---- tool episodes: bounded results, context stops -------------------------------------------------------------------
def _end_id(tok):
    return tok.convert_tokens_to_ids("<|im_end|>")


def _tool_task(tool, **kw):
    def answered(completions, **_):
        return [float(bool(c[-1]["content"])) for c in completions]

    rows = [{"prompt": [{"role": "user", "content": "read the log"}]}]
    return Task("logs", rows, rows, Rubric([RewardComponent("answered", answered)]), tools=[tool], max_turns=30,
                **kw)


CALL = '<tool_call>{"name": "read", "arguments": {}}</tool_call>'


def test_a_5mb_tool_result_is_cut_with_a_marker_before_it_is_tokenized(tiny):
    _, tok = tiny

    def read() -> str:
        """Read the whole log."""
        return "x" * 5_000_000

    task = _tool_task(read, max_observation_chars=2000)
    env = ToolEnv(task, tok, SampleParams(max_tokens=32), task.tools, max_turns=2)
    sampler = ScriptedSampler(tok, [CALL, "done"], end_token_id=_end_id(tok))
    t0 = time.monotonic()
    t = asyncio.run(env.rollout(task.train_rows[0], sampler))
    assert time.monotonic() - t0 < 20  # a bound on the blow-up (tokenizing 5 MB took tens of seconds), not a timing
    shown = next(m["content"] for m in t.messages if m["role"] == "tool")
    assert len(shown) <= 2000 and "[truncated: 49980" in shown
    assert t.metrics["tool_results_truncated"] == 1.0
    assert len(t.turns[1].prompt_ids) < 4000  # the next prompt holds the cut result, not 5 million tokens


def test_a_tool_episode_that_outgrows_the_context_ends_with_a_context_stop_and_is_trained(tiny):
    _, tok = tiny

    def read() -> str:
        """Read the next page of the log."""
        return "line " * 60

    task = _tool_task(read)
    env = ToolEnv(task, tok, SampleParams(max_tokens=32), task.tools, max_turns=30)
    first = len(env.initial_messages(task.train_rows[0])[0]["content"])  # the tools' system prompt, ~1 token a char
    budget = ContextBudget(first + 1200)
    sampler = ScriptedSampler(tok, [CALL], end_token_id=_end_id(tok), context=budget)
    t = asyncio.run(safe_rollout(env, task.train_rows[0], sampler, env.params))
    assert not t.failed, t.error
    assert t.stop_reason == "context" and t.turns[-1].finish_reason == "length"
    assert 2 <= len(t.turns) < 30 and t.metrics["context_stop"] == 1.0
    assert all(len(turn.prompt_ids) + 32 <= budget.max_context for turn in t.turns)
    (t,) = asyncio.run(scored_by(env, [t]))
    assert not t.failed  # scored like any episode: the rubric saw its last reply


def test_under_truncate_a_late_turn_is_cut_to_fit_before_the_episode_stops(tiny):
    _, tok = tiny

    def read() -> str:
        """Read the next page of the log."""
        return "line " * 40

    task = _tool_task(read)
    env = ToolEnv(task, tok, SampleParams(max_tokens=200), task.tools, max_turns=30)
    asked: list[int] = []

    class Recording(ScriptedSampler):
        async def sample(self, prompts_P, params, n=1):
            out = await super().sample(prompts_P, params, n)
            asked.append(params.max_tokens)
            return out

    first = len(env.initial_messages(task.train_rows[0])[0]["content"])
    budget = ContextBudget(first + 1000, overflow="truncate", min_new_tokens=16)
    t = asyncio.run(env.rollout(task.train_rows[0], Recording(tok, [CALL], end_token_id=_end_id(tok),
                                                              context=budget)))
    assert t.stop_reason == "context"
    assert asked[0] == 200 and min(asked) < 200 and min(asked) >= 16  # later turns were cut, then it stopped


def test_a_first_prompt_past_the_context_fails_the_sample_with_the_numbers(tiny):
    _, tok = tiny

    def read() -> str:
        """Read."""
        return ""

    rows = [{"prompt": [{"role": "user", "content": "word " * 600}]}]
    task = Task("big", rows, rows, Rubric([RewardComponent("a", lambda completions, **_: [0.0] * len(completions))]),
                tools=[read], max_turns=3)
    env = ToolEnv(task, tok, SampleParams(max_tokens=32), task.tools)
    sampler = ScriptedSampler(tok, [CALL], end_token_id=_end_id(tok), context=ContextBudget(256))
    t = asyncio.run(safe_rollout(env, rows[0], sampler, env.params))
    assert t.failed and "ContextOverflow" in t.error and "context of 256 tokens" in t.error


def test_truncate_text_marks_what_it_cut():
    assert truncate_text("short", 10) == ("short", 0)
    text, cut = truncate_text("y" * 1000, 100)
    assert len(text) <= 100 and text.startswith("y") and f"[truncated: {cut} more characters]" in text
    assert len(text) - len(text.split("\n...")[0]) + (1000 - cut) <= 100 + 40


def test_the_config_sets_the_cut_of_tool_results():
    from posttrain.config import load_config
    from posttrain.tasks.from_config import task_from_config

    cfg = load_config(None, ["task.name=search-qa", "task.max_observation_chars=300"])
    assert task_from_config(cfg.task).max_observation_chars == 300
    assert task_from_config(load_config(None, ["task.name=search-qa"]).task).max_observation_chars == 8000
