"""The Sampler protocol: async generation that returns token ids, sampler logprobs and the policy version."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from posttrain.sampling.context import ContextBudget
from posttrain.types import Completion, SampleParams


@runtime_checkable
class Sampler(Protocol):
    """Anything that turns prompt token ids into completions.

    `sample(prompts_P, params, n)` returns, for each of the P prompts, n completions. Each completion carries
    its token ids, the sampler's logprob of each token (of softmax(logits / temperature)), its finish reason
    and the policy version that produced it. Implementations never re-tokenize text they were given as ids.

    `context` is the budget every prompt + max_tokens must fit (sampling/context.py), checked before any engine sees
    a row: a call of one prompt that does not fit raises ContextOverflow for that caller alone (or has its
    max_tokens cut); in a call of several, each row that does not fit comes back as n completions with
    finish_reason "context_overflow" (no tokens, the reason in `error`) and the others are served.
    Multi-turn envs read it to end an episode that outgrows it. None: the sampler does not know its context
    (a scripted sampler in tests).
    """

    # Read-only here (what rollouts read): a sampler may hold them as plain attributes or properties, and may type
    # `context` without the None.
    @property
    def policy_version(self) -> int: ...

    @property
    def context(self) -> ContextBudget | None: ...

    async def sample(self, prompts_P: list[list[int]], params: SampleParams, n: int = 1) -> list[list[Completion]]: ...

    def decode(self, token_ids: list[int]) -> str: ...


class Versioned(Protocol):
    """A sampler whose weights another object writes (a sync sharing its module, a weight transport, the ES
    stepper): it cannot tell the new version by itself, so that object tells it. Nothing else sets a sampler's
    version (tests/test_house.py)."""

    @property
    def policy_version(self) -> int: ...

    def set_version(self, version: int) -> None: ...


def first_push(sync: Any, version: int) -> None:
    """A rollout sampler's first weight push (it serves what the trainer holds now, after any warm start). A push
    that fails closes what the sync holds (actors, servers, an engine's files) before the error goes on, so a run
    that cannot start leaves nothing running."""
    try:
        sync.push(version)
    except BaseException:
        sync.close()
        raise
