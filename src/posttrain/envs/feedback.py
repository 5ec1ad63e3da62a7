"""Feedback in words: what went wrong with a sample, beside its scalar reward.

A task declares `feedback`, a function with the reward functions' signature (TRL style) that returns one short
text (or None) per completion:

    def feedback(completions, **columns) -> list[str | None]

It is asked only about the samples that did not pass (a passing sample has nothing to fix), once per scoring
batch, and the text lands on `Trajectory.feedback` (samples.jsonl shows it; hint-conditioned self-distillation
turns it into a teacher's hint). Envs that know better where a thing went wrong set the feedback themselves
(ToolEnv: the first failed tool call, and the turn that made it); a task function never overwrites it.

Feedback is advice, not reward: a feedback function that raises or runs past its timeout leaves those samples
without feedback, counted in `feedback/errors`, and never fails a sample.
"""

from __future__ import annotations

from typing import Any

from posttrain.rewards.rubric import _call_with_timeout, call_trl_style
from posttrain.types import Trajectory

MAX_FEEDBACK_CHARS = 600  # a hint is read by the model in its context: keep it short whatever a function returns


def attach_feedback(task: Any, trajectories: list[Trajectory], timeout_s: float = 30.0) -> dict[str, float]:
    """Ask the task's feedback function about every scored sample that did not pass; returns counters."""
    fn = getattr(task, "feedback", None)
    todo = [t for t in trajectories if not t.failed and not t.passed and t.feedback is None]
    if fn is None or not todo:
        return {}
    conv = bool(getattr(task, "conversational", False))
    completions = [[{"role": "assistant", "content": t.completion_text}] if conv else t.completion_text for t in todo]
    keys = [k for k in dict.fromkeys(k for t in todo for k in t.row) if k != "prompt"]
    kwargs = {k: [t.row.get(k) for t in todo] for k in keys}
    kwargs["prompts"] = [t.row.get("prompt") for t in todo]
    try:
        texts = _call_with_timeout(fn, completions, kwargs, timeout_s, call=call_trl_style)
    except Exception:  # noqa: BLE001 - advice that cannot be computed is skipped, the sample is still trained
        return {"feedback/errors": float(len(todo))}
    n = 0
    for t, text in zip(todo, texts, strict=True):
        if text:
            t.feedback = str(text)[:MAX_FEEDBACK_CHARS]
            n += 1
    return {"feedback/attached": float(n)}
