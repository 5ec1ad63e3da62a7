"""One scenario for every engine (the own sampler, vLLM in process, vLLM servers): multi-turn episodes that grow
past the sampler's context, run in the same event-loop turns as short single-turn rollouts and one prompt that
cannot fit at all. `run_scenario(sampler, tok)` runs it through the real envs; `check_scenario` asserts:

- every growing episode ends with stop_reason "context", is not failed, its last turn marked truncated
  ("length"), and every turn it sampled fits the budget;
- the short rollouts coalesced with them are served (none failed);
- the one prompt past the context fails alone, with a ContextOverflow reason;
- the context-stopped episodes are trained on: they become sequences in the step's batch.

The growing episodes are GymTextEnv episodes whose env never terminates and answers every reply with a long
observation, so a random tiny policy cannot end them early; ToolEnv shares the same turn step
(envs/tool_env.py `sample_turn`), tested with tools in tests/envs/test_context_budget.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

import gymnasium as gym
from gymnasium import spaces

from posttrain.envs.gym_text import GymTextEnv
from posttrain.envs.isolate import safe_rollout
from posttrain.envs.single_turn import SingleTurnEnv
from posttrain.envs.task import Task
from posttrain.loop.batch import BatchOptions, build_batch, number_samples, sequences_from_groups
from posttrain.rewards.rubric import RewardComponent, Rubric
from posttrain.types import Group, SampleParams

OBSERVATION = "the corridor goes on; " * 3  # 66 characters: 66 tokens of the tiny models' tokenizer


class EndlessCorridor(gym.Env):
    """Text in, text out, never done: only the context (or max_turns) ends an episode."""

    observation_space = spaces.Text(max_length=10_000)
    action_space = spaces.Text(max_length=10_000)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return OBSERVATION, {}

    def step(self, action):
        return OBSERVATION, float(len(action) % 3), False, False, {}


def _length_reward(completions, **kw):
    return [float(len(c[-1]["content"]) % 5) for c in completions]


def _task(prompts: list[str]) -> Task:
    rows = [{"prompt": [{"role": "user", "content": p}]} for p in prompts]
    return Task("ctx", rows, rows, Rubric([RewardComponent("len", _length_reward)]))


async def _scenario(sampler: Any, tok: Any, episodes: int, short: int, max_tokens: int, max_turns: int):
    params = SampleParams(max_tokens=max_tokens, temperature=1.0)
    gym_task = _task(["Walk the corridor."])
    gym_env = GymTextEnv(gym_task, tok, params, make_env=lambda row: EndlessCorridor(), max_turns=max_turns)
    short_task = _task([f"Say {i}." for i in range(short)])
    short_env = SingleTurnEnv(short_task, tok, params)
    budget = sampler.context.max_context
    huge_task = _task(["word " * (budget + 50)])  # its first prompt alone is past the context
    huge_env = SingleTurnEnv(huge_task, tok, params)
    jobs = ([safe_rollout(gym_env, gym_task.train_rows[0], sampler, params) for _ in range(episodes)]
            + [safe_rollout(short_env, r, sampler, params) for r in short_task.train_rows]
            + [safe_rollout(huge_env, huge_task.train_rows[0], sampler, params)])
    trajs = await asyncio.gather(*jobs)
    long_, shorts, huge = trajs[:episodes], trajs[episodes:episodes + short], trajs[-1]
    await gym_env.score(long_)
    return long_, shorts, huge


def run_scenario(sampler: Any, tok: Any, episodes: int = 2, short: int = 3, max_tokens: int = 16,
                 max_turns: int = 40):
    return asyncio.run(_scenario(sampler, tok, episodes, short, max_tokens, max_turns))


def check_scenario(result, budget: int) -> None:
    long_, shorts, huge = result
    for t in long_:
        assert not t.failed, t.error
        assert t.stop_reason == "context", (t.stop_reason, len(t.turns))
        assert t.turns[-1].finish_reason == "length"
        assert t.metrics["context_stop"] == 1.0
        assert len(t.turns) >= 2
        for turn in t.turns:
            assert len(turn.prompt_ids) + len(turn.completion_ids) <= budget
    for t in shorts:
        assert not t.failed, t.error
        assert t.turns[0].completion_ids
    assert huge.failed and "ContextOverflow" in (huge.error or "") and str(budget) in huge.error, huge.error
    groups = number_samples([Group(0, list(long_))])
    long_ = groups[0].trajectories_G
    seqs = sequences_from_groups(groups)
    assert len(seqs) == len(long_) and all(any(s.loss_mask) for s in seqs)
    batch, _ = build_batch(seqs, BatchOptions(keep_zero_advantage=True))
    assert {s.sample_id for s in batch.sequences} == {t.sample_id for t in long_}
