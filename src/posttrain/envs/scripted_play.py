"""Play fixed replies through the env a task trains in, and score the episode: a multi-turn smoke check
(`SmokeCheck.replies`, envs/smoke_checks.py) without a model.

The scripted policy runs on the tiny-random tokenizer (built in memory, nothing to download): the check is about
the env (its tools, its per-episode state, its grader), not about a model's tokens.
"""

from __future__ import annotations

from typing import Any

from posttrain.aio import run_sync
from posttrain.envs.base import make_env
from posttrain.envs.scoring import failed, scored
from posttrain.envs.task import Task
from posttrain.sampling.scripted import ScriptedSampler
from posttrain.types import SampleParams, Trajectory


def play_episode(task: Task, row: dict[str, Any], replies: list[str]) -> Trajectory:
    """Play `replies` as a scripted policy through the task's env (make_env) and score the episode. Returns the
    scored Trajectory (it has `reward`, `passed`, `failed` and `error`, like a rubric Score)."""
    tok = _check_tokenizer()
    params = SampleParams(max_tokens=task.max_tokens or 256, stop=list(task.stop))
    env = make_env(task, tok, params)
    sampler = ScriptedSampler(tok, list(replies), stop_ends_reply=True)

    async def episode() -> Trajectory:
        traj = await env.rollout(row, sampler, params)
        (score,) = await env.score([traj])
        return scored(traj, score)

    traj = run_sync(episode)
    if sampler.calls > len(replies):  # the script ran out and cycled: what was scored is not the scripted episode
        return failed(
            traj, f"the env asked for {sampler.calls} replies, the script has {len(replies)}", keep_reward=True
        )
    return traj


_TOKENIZER: list[Any] = []


def _check_tokenizer() -> Any:
    # One tokenizer for every check: ToolEnv checks a tokenizer's chat template once per object.
    if not _TOKENIZER:
        from posttrain.models.tiny import tiny_tokenizer

        _TOKENIZER.append(tiny_tokenizer())
    return _TOKENIZER[0]
