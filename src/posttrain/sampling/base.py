"""The Sampler protocol: async generation that returns token ids, sampler logprobs and the policy version."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from posttrain.types import Completion, SampleParams


@runtime_checkable
class Sampler(Protocol):
    """Anything that turns prompt token ids into completions.

    `sample(prompts_P, params, n)` returns, for each of the P prompts, n completions. Each completion carries
    its token ids, the sampler's logprob of each token (of softmax(logits / temperature)), its finish reason
    and the policy version that produced it. Implementations never re-tokenize text they were given as ids.
    """

    policy_version: int

    async def sample(self, prompts_P: list[list[int]], params: SampleParams, n: int = 1) -> list[list[Completion]]: ...

    def decode(self, token_ids: list[int]) -> str: ...


def first_push(sync: Any, version: int) -> None:
    """A rollout sampler's first weight push (it serves what the trainer holds now, after any warm start). A push
    that fails closes what the sync holds (actors, servers, an engine's files) before the error goes on, so a run
    that cannot start leaves nothing running."""
    try:
        sync.push(version)
    except BaseException:
        sync.close()
        raise
