"""SingleTurnEnv: prompt -> one completion -> rubric reward."""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from posttrain.envs.isolate import prompt_text
from posttrain.envs.task import Task
from posttrain.models.chat import render_prompt
from posttrain.rewards.rubric import Score
from posttrain.sampling.base import Sampler
from posttrain.types import SampleParams, Trajectory, Turn

RENDERED_PROMPTS = 4096  # rendered prompts a SingleTurnEnv keeps


def prompt_key(prompt: Any) -> str:
    """A prompt (text, or chat messages) as a cache key."""
    return prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True, default=str)


class SingleTurnEnv:
    def __init__(self, task: Task, tokenizer: Any, params: SampleParams):
        self.task = task
        self.tokenizer = tokenizer
        self.params = params
        # Rendered prompts by their text: a row's prompt renders the same every time. Bounded, because a wrapper
        # env may write model text into prompts (insights): least recently used out first.
        self._rendered: OrderedDict[str, list[int]] = OrderedDict()

    def prompt_ids(self, row: dict[str, Any]) -> list[int]:
        key = prompt_key(row["prompt"])
        if key in self._rendered:
            self._rendered.move_to_end(key)
        else:
            self._rendered[key] = render_prompt(self.tokenizer, row["prompt"])
            if len(self._rendered) > RENDERED_PROMPTS:
                self._rendered.popitem(last=False)
        return list(self._rendered[key])

    async def rollout(self, row: dict[str, Any], sampler: Sampler, params: SampleParams | None = None) -> Trajectory:
        ids = self.prompt_ids(row)
        ((c,),) = await sampler.sample([ids], params or self.params, n=1)
        turn = Turn(
            prompt_ids=ids,
            completion_ids=c.token_ids,
            completion_logprobs=c.logprobs,
            policy_version=c.policy_version,
            finish_reason=c.finish_reason,
            token_versions=c.token_versions,
        )
        return Trajectory(turns=[turn], prompt_text=prompt_text(row["prompt"]), completion_text=c.text, row=row)

    async def score(self, trajectories: list[Trajectory]) -> list[Score]:
        return score_with_rubric(self.task, trajectories)


def score_with_rubric(
    task: Task, trajectories: list[Trajectory], extra_columns: Callable[[Trajectory], dict[str, Any]] | None = None
) -> list[Score]:
    """The rubric's score of each trajectory's final answer (one batched call; envs/scoring.py joins them).
    Reward functions get the row's columns, plus `extra_columns(trajectory)` (ToolEnv adds its tool calls)."""
    if not trajectories:
        return []
    conv = task.conversational
    completions = [
        [{"role": "assistant", "content": t.completion_text}] if conv else t.completion_text for t in trajectories
    ]
    rows = [
        {**{k: v for k, v in t.row.items() if k != "prompt"}, **(extra_columns(t) if extra_columns else {})}
        for t in trajectories
    ]
    return task.rubric.score(
        completions,
        rows,
        prompts=[t.row["prompt"] for t in trajectories],
        completion_ids=[t.completion_ids for t in trajectories],
    )
