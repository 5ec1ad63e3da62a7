"""A remedy's guided format hint (Guide, Nath et al. 2025, arXiv:2506.13923): some samples of a stalled prompt
are drawn with the row's `format_hint` appended, then trained as if the prompt had never had it, so what the hint
made likely becomes likely without it. `RolloutSpec.groups` (loop/collect.py) calls these two functions; which rows
are hinted, and when, is the remedy policy's business (obs/remedies.py).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from posttrain.envs.base import Env
from posttrain.types import SampleParams, Trajectory


class _FirstPrompt(Exception):
    def __init__(self, ids: list[int]):
        self.ids = ids


class _PromptRecorder:
    """A sampler that answers nothing: it records the first prompt an env asks it about and stops the episode."""

    context = None

    async def sample(self, prompts: list[list[int]], params: SampleParams, n: int = 1):
        raise _FirstPrompt(list(prompts[0]))


async def first_prompt_ids(env: Env, row: dict[str, Any], params: SampleParams) -> list[int] | None:
    """The token ids of the first model call an env makes for `row`, found by rolling out against a sampler that
    stops at the first call: any env, single- or multi-turn, without an env-specific rendering API. None when
    the env never asks (or fails before asking)."""
    try:
        await env.rollout(row, _PromptRecorder(), params)  # pyright: ignore[reportArgumentType]  # stub: sample() only
    except _FirstPrompt as got:
        return got.ids
    except Exception:  # noqa: BLE001 - an env that cannot be probed keeps its samples as sampled
        return None
    return None


def strip_prompt(t: Trajectory, row: dict[str, Any], plain_ids: list[int] | None) -> Trajectory:
    """A trajectory sampled from a transformed prompt (a format hint) as if sampled from the plain one: every
    turn's prompt starts with the first turn's prompt (the multi-turn prefix contract), so that prefix is swapped
    for `plain_ids` in each turn; the row goes back to the plain row (the reward sees the task as it is). The sampler
    log-probs stay those of the hinted context: they are the behaviour policy's (`Trajectory.guided` marks it, and
    the sampler-vs-trainer metrics leave these samples out). When the prefix contract does not hold or the plain
    prompt is unknown: `t` as sampled, marked `guide_unstripped` (not `guided`)."""
    hinted = list(t.turns[0].prompt_ids)
    if plain_ids is None or any(list(u.prompt_ids[: len(hinted)]) != hinted for u in t.turns):
        return replace(t, metrics={**t.metrics, "guide_unstripped": 1.0})
    return replace(
        t,
        turns=[replace(u, prompt_ids=list(plain_ids) + list(u.prompt_ids[len(hinted) :])) for u in t.turns],
        row=row,
        guided=True,
        prompt_text=_plain_text(t.prompt_text, row),
        metrics={**t.metrics, "guided": 1.0},
    )


def _plain_text(hinted_text: str, row: dict[str, Any]) -> str:
    hint = row.get("format_hint")
    return hinted_text.replace(f"\n{hint}", "", 1) if hint else hinted_text
