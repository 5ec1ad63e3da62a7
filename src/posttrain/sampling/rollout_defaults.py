"""A request's unset sampling fields filled from its rollout's defaults (RolloutRecorder.set_defaults, keyed by the
`X-Rollout-Id` header or the body's `rollout_id`), before the server builds its SampleParams.

Why: agent frameworks set no temperature, so the server would sample at OpenAI's default of 1.0 while the trainer
scores at the run's `sampling.temperature`: every token off-policy. AgentEnv stores the run's settings for each
rollout; a request that sets a field keeps its value, and one that sets another temperature than the rollout's
is counted (the record says so: RolloutRecord.temperature_overrides). A request without defaults is untouched.
"""

from __future__ import annotations

from typing import TypeVar

from pydantic import BaseModel

from posttrain.sampling.openai_requests import CompletionRequest
from posttrain.sampling.recorder import RolloutRecorder

B = TypeVar("B", bound=BaseModel)

# The fields of every request schema (chat, completions, responses) that the defaults fill.
FILLED = ("temperature", "top_p", "top_k")


def _unset(body: BaseModel, name: str) -> bool:
    return name not in body.model_fields_set or getattr(body, name, None) is None


def with_rollout_defaults(body: B, recorder: RolloutRecorder, rollout_id: str | None) -> B:
    """`body` with its rollout's defaults in the sampling fields it left unset (a copy; `body` when it has none).
    /v1/completions' max_tokens too: its own default is OpenAI's 16 (a chat request's is the server's)."""
    d = recorder.defaults(rollout_id) if rollout_id else None
    if d is None or rollout_id is None:
        return body
    update = {name: getattr(d, name) for name in FILLED if getattr(d, name) is not None and _unset(body, name)}
    if d.max_tokens is not None and isinstance(body, CompletionRequest) and _unset(body, "max_tokens"):
        update["max_tokens"] = d.max_tokens
    asked = getattr(body, "temperature", None)
    if d.temperature is not None and not _unset(body, "temperature") and isinstance(asked, (int, float)):
        if abs(float(asked) - d.temperature) > 1e-6:
            recorder.count_temperature_override(rollout_id, float(asked))
    return body.model_copy(update=update) if update else body
