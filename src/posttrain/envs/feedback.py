"""Feedback in words: what went wrong with a sample, beside its scalar reward.

A task declares `feedback`, a function with the reward functions' signature (TRL style) that returns one short
text (or None) per completion:

    def feedback(completions, **columns) -> list[str | None]

It is asked only about the samples that did not pass (a passing sample has nothing to fix), once per scoring
batch, and the text lands on `Trajectory.feedback` (samples.jsonl shows it; hint-conditioned self-distillation
turns it into a teacher's hint). Envs that know better where a thing went wrong set the feedback themselves
(ToolEnv: the first failed tool call, and the turn that made it); a task function never overwrites it.

Feedback is advice, not reward: a feedback function that raises or runs past its timeout leaves those samples
without feedback and never fails a sample. Each sample it was asked about then carries `feedback/failed` = 1 in its
metrics, so the step's record shows the share as `episode/feedback/failed` (obs/rollout_stats.py); the samples it
answered carry their text in `Trajectory.feedback`.
"""

from __future__ import annotations

from dataclasses import replace

from posttrain.envs.task import Task
from posttrain.rewards.rubric import call_trl_style, call_with_timeout
from posttrain.types import Trajectory

MAX_FEEDBACK_CHARS = 600  # a hint is read by the model in its context: keep it short whatever a function returns
FAILED = "feedback/failed"  # the metric of a sample whose feedback function raised or timed out


def attach_feedback(task: Task, trajectories: list[Trajectory], timeout_s: float = 30.0) -> list[Trajectory]:
    """Ask the task's feedback function about every scored sample that did not pass: the trajectories, those it
    had feedback for as new ones with it (those it failed on as new ones with `feedback/failed` in their metrics)."""
    fn = task.feedback
    # Not asked again: a sample with feedback, or whose function already failed (an env that asked while scoring)
    idx = [
        i
        for i, t in enumerate(trajectories)
        if not t.failed and not t.passed and t.feedback is None and FAILED not in t.metrics
    ]
    if fn is None or not idx:
        return list(trajectories)
    todo = [trajectories[i] for i in idx]
    conv = task.conversational
    completions = [[{"role": "assistant", "content": t.completion_text}] if conv else t.completion_text for t in todo]
    keys = [k for k in dict.fromkeys(k for t in todo for k in t.row) if k != "prompt"]
    kwargs = {k: [t.row.get(k) for t in todo] for k in keys}
    kwargs["prompts"] = [t.row.get("prompt") for t in todo]
    out = list(trajectories)
    try:
        texts = call_with_timeout(fn, completions, kwargs, timeout_s, call=call_trl_style)
    except Exception:  # noqa: BLE001 - advice that cannot be computed is skipped, the sample is still trained
        for i in idx:
            out[i] = replace(out[i], metrics={**out[i].metrics, FAILED: 1.0})
        return out
    for i, text in zip(idx, texts, strict=True):
        if text:
            out[i] = replace(out[i], feedback=str(text)[:MAX_FEEDBACK_CHARS])
    return out
