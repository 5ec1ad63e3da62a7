"""Who answers a judge's questions: the `JudgeBackend` protocol.

    judge_id: str                                          names the judge model (part of every cache key)
    yes_prob(prompts) -> [P(Yes) | JudgeError, ...]        P(Yes) / (P(Yes) + P(No)) of the first answer token
    generate(prompts, max_tokens) -> [text | JudgeError]   a greedy free-form answer

Prompts are the text of one user message; the backend applies its chat template (local) or sends it as a chat
message (OpenAI-compatible). A backend returns one result per prompt, an exception in the place of each prompt
it could not answer (whatever went wrong with that one reply), and raises only when the whole call failed.
Timeouts and retries are the runner's (runner.py), except the HTTP timeout, which the OpenAI backend passes to
its client. What a backend returns is checked again by the judge's parser (verdicts.py): it is hostile input.

Implementations: `LocalHFBackend` (local_hf.py, an in-process HF model) and `OpenAIBackend` (openai_backend.py).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from posttrain.rewards.judges.verdicts import label_of


@runtime_checkable
class JudgeBackend(Protocol):
    @property
    def judge_id(self) -> str: ...  # read-only: a backend may resolve it on first use (OpenAIBackend asks the endpoint)

    def yes_prob(self, prompts: list[str]) -> list[float | Exception]: ...

    def generate(self, prompts: list[str], max_tokens: int) -> list[str | Exception]: ...


def yes_no_from_text(text: str) -> float | None:
    """1.0 / 0.0 when the whole answer is yes / no (case, quotes, markup and end punctuation aside), else None:
    "Yes, but no" is not a verdict (verdicts.py)."""
    return label_of(text)


def is_yes_token(tok: str) -> bool:
    return tok.strip().strip(".,:;!\"'*").lower() == "yes"


def is_no_token(tok: str) -> bool:
    return tok.strip().strip(".,:;!\"'*").lower() == "no"
