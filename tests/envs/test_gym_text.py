"""GymTextEnv: a standard Gymnasium env (FrozenLake) round-trips through the text adapter with a scripted sampler:
same actions, same return as stepping the env directly; bad replies are fed back and counted; tokens keep the
multi-turn prefix contract; a hung env fails its trajectory under the timeout."""

import asyncio
import time

import gymnasium as gym
import pytest
from gymnasium import spaces

from posttrain.envs.gym_text import GymTextEnv, default_text_to_action, episode_return
from posttrain.envs.task import Task
from posttrain.rewards.rubric import RewardComponent, Rubric
from posttrain.sampling.scripted import ScriptedSampler as _Scripted
from posttrain.types import SampleParams
from posttrain.envs.scoring import scored_by

LAKE_ACTIONS = {"left": 0, "down": 1, "right": 2, "up": 3}


@pytest.fixture(scope="module")
def tok():
    from posttrain.models.tiny import tiny_tokenizer

    return tiny_tokenizer()  # the tiny-random model's tokenizer; no model is needed here


def ScriptedSampler(tok, replies):  # noqa: N802 - end turns with <|im_end|> as a chat model does
    return _Scripted(tok, replies, end_token_id=tok.convert_tokens_to_ids("<|im_end|>"))


def lake_text(s: int) -> str:
    return f"You are on cell {s} (row {s // 4}, column {s % 4}) of a 4x4 frozen lake. Goal: cell 15."


def lake_action(text: str) -> int:
    word = text.strip().lower()
    if word not in LAKE_ACTIONS:
        raise ValueError(f"reply with one of {', '.join(LAKE_ACTIONS)}, got {word[:20]!r}")
    return LAKE_ACTIONS[word]


def _task(rows):
    return Task("lake", rows, rows, Rubric([RewardComponent("episode_return", episode_return)]))


def _lake_env(tok, max_turns=12):
    rows = [{"prompt": [{"role": "user", "content": "Walk to the goal. Reply with left, down, right or up."}],
             "seed": 0}]
    return GymTextEnv(_task(rows), tok, SampleParams(max_tokens=8),
                      make_env=lambda row: gym.make("FrozenLake-v1", is_slippery=False),
                      obs_to_text=lake_text, text_to_action=lake_action, max_turns=max_turns)


def _direct_return(replies):
    env = gym.make("FrozenLake-v1", is_slippery=False)
    env.reset(seed=0)
    total = 0.0
    for r in replies:
        try:
            a = lake_action(r)
        except ValueError:
            continue
        _, rew, term, trunc, _ = env.step(a)
        total += rew
        if term or trunc:
            break
    return total


@pytest.mark.parametrize("replies", [
    ["right", "right", "down", "jump!", "down", "down", "right"],  # reaches the goal, one bad reply on the way
    ["down", "right"],  # into the hole at cell 5
])
def test_frozenlake_round_trip_equals_direct_play(tok, replies):
    env = _lake_env(tok)
    sampler = ScriptedSampler(tok, replies)
    traj = asyncio.run(env.rollout(env.task.train_rows[0], sampler))
    (traj,) = asyncio.run(scored_by(env, [traj]))
    assert not traj.failed, traj.error
    assert traj.reward == traj.metrics["return"] == _direct_return(replies)
    assert traj.metrics["terminated"] == 1.0 and traj.metrics["turns"] == len(replies)
    assert traj.metrics["bad_actions"] == sum(r == "jump!" for r in replies)
    assert traj.extra["actions"] == [str(lake_action(r)) for r in replies if r != "jump!"]
    # the bad reply came back as a clear message, and every observation is a user message
    users = [m["content"] for m in traj.messages if m["role"] == "user"]
    if "jump!" in replies:
        assert any(u.startswith("Invalid action: reply with one of left, down, right, up") for u in users)
    assert users[0].endswith(lake_text(0))
    # multi-turn token contract: each prompt extends the last (sequence() checks), env tokens masked out
    tokens, mask, logps = traj.sequence()
    assert sum(mask) == sum(len(t.completion_ids) for t in traj.turns)
    assert sampler.prompts == [t.prompt_ids for t in traj.turns]
    assert all(logps[i] == 0.0 for i, m in enumerate(mask) if m == 0)


def test_max_turns_stops_a_model_that_never_answers(tok):
    env = _lake_env(tok, max_turns=3)
    traj = asyncio.run(env.rollout(env.task.train_rows[0], ScriptedSampler(tok, ["hmm"])))
    assert traj.metrics["turns"] == 3 and traj.metrics["bad_actions"] == 3 and traj.metrics["bad_action_rate"] == 1.0
    assert traj.metrics["env_steps"] == 0 and traj.metrics["return"] == 0.0


class _TextEcho(gym.Env):
    """A Text-in, Text-out env: needs neither obs_to_text nor text_to_action. Says 'done' ends it."""

    def __init__(self, hang_s: float = 0.0):
        self.observation_space = spaces.Text(64)
        self.action_space = spaces.Text(64)
        self.hang_s = hang_s

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "say something", {}

    def step(self, action):
        time.sleep(self.hang_s)
        return f"you said {action}", 1.0, action == "done", False, {}


def test_text_spaces_need_no_parsers_and_a_hung_env_fails_its_trajectory(tok):
    rows = [{"prompt": "play"}]
    env = GymTextEnv(_task(rows), tok, SampleParams(max_tokens=8), make_env=lambda row: _TextEcho(), max_turns=5)
    traj = asyncio.run(env.rollout(rows[0], ScriptedSampler(tok, ["hi", "done"])))
    assert traj.metrics["return"] == 2.0 and traj.extra["actions"] == ["hi", "done"]
    slow = GymTextEnv(_task(rows), tok, SampleParams(max_tokens=8), make_env=lambda row: _TextEcho(hang_s=1.0),
                      step_timeout_s=0.2)
    t0 = time.perf_counter()
    traj = asyncio.run(slow.rollout(rows[0], ScriptedSampler(tok, ["hi"])))
    assert traj.failed and "longer than 0.2s" in traj.error and time.perf_counter() - t0 < 3.0


def test_discrete_default_parser_and_unsupported_spaces():
    parse = default_text_to_action(spaces.Discrete(4))
    assert parse(" 2 ") == 2
    with pytest.raises(ValueError, match="out of range"):
        parse("7")
    with pytest.raises(ValueError, match="action's number"):
        parse("left")
    with pytest.raises(ValueError, match="pass text_to_action"):
        default_text_to_action(spaces.Box(0, 1, (2,)))
