"""The context budget: one rule, for every engine, that keeps each prompt and its completion within the model's
context.

    budget = ContextBudget(max_context=2048)                    the model's (or the engine's) positions
    params = budget.fit_call(prompts_P, params)                 before any sampling call: raises ContextOverflow
                                                                (or, overflow="truncate", cuts max_tokens to fit)

Why before the call: a vLLM engine (in process or a server) refuses a whole `generate` call when one of its rows
does not fit, so one long episode would take every row coalesced with it down; the own decode loop would decode
past the model's positions without a word. Checking each caller's rows before they are coalesced
(sampling/coalesce.py) fails only the caller whose prompt does not fit, with the numbers in the message.

Multi-turn envs read the sampler's budget turn by turn (`room`), so an episode that grows past the context ends
with a context stop and is trained on as truncated, instead of failing at the sampler (envs/tool_env.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

from posttrain.types import SampleParams

Overflow = Literal["fail", "truncate"]

# A model whose config names no position limit (some remote servers, rotary models without the field): the limit
# vLLM itself assumes when it cannot tell.
UNKNOWN_CONTEXT = 4096


class ContextOverflow(ValueError):
    """A prompt, with the tokens asked for, does not fit the model's context: the sample it belongs to fails (alone)
    with this reason. A ValueError: the caller's input was wrong, the engine is fine."""

    def __init__(self, prompt_tokens: int, max_tokens: int, max_context: int):
        self.prompt_tokens, self.max_tokens, self.max_context = prompt_tokens, max_tokens, max_context
        super().__init__(
            f"context overflow: a prompt of {prompt_tokens} tokens + max_tokens {max_tokens} exceeds the "
            f"model's context of {max_context} tokens (sampling.max_context; "
            "sampling.context_overflow=truncate cuts max_tokens to fit instead)"
        )


@dataclass(frozen=True)
class ContextBudget:
    """How many positions a prompt and its completion may take together, and what to do with a row past them."""

    max_context: int
    overflow: Overflow = "fail"
    # The fewest new tokens worth sampling when `truncate` cuts a completion: below it the row fails instead, and a
    # multi-turn episode ends rather than start a turn it cannot finish.
    min_new_tokens: int = 16

    def __post_init__(self):
        if self.max_context < 2:
            raise ValueError(f"max_context must be >= 2, got {self.max_context}")

    def room(self, prompt_tokens: int) -> int:
        """New tokens a prompt of this length leaves (0 or less: it does not fit at all)."""
        return self.max_context - prompt_tokens

    def fit(self, prompt_tokens: int, max_tokens: int) -> int:
        """The max_tokens a row of `prompt_tokens` may have: as asked when it fits; cut to the room left under
        `truncate` (when at least min(min_new_tokens, max_tokens) fit); otherwise ContextOverflow."""
        room = self.room(prompt_tokens)
        if max_tokens <= room:
            return max_tokens
        if self.overflow == "truncate" and room >= min(self.min_new_tokens, max_tokens):
            return room
        raise ContextOverflow(prompt_tokens, max_tokens, self.max_context)

    def fit_call(self, prompts_P: list[list[int]], params: SampleParams) -> SampleParams:
        """`params` for one sampling call, its max_tokens cut to what the longest prompt leaves (truncate), or
        ContextOverflow naming the longest prompt. One call's rows share one max_tokens: callers that mix long
        and short prompts in one call share the cut (envs call with one prompt at a time)."""
        if not prompts_P:
            return params
        longest = max(len(p) for p in prompts_P)
        fitted = self.fit(longest, params.max_tokens)
        return params if fitted == params.max_tokens else replace(params, max_tokens=fitted)


def context_of(sampler: Any) -> ContextBudget | None:
    """A sampler's budget (`Sampler.context`). A sampler written before the protocol had `context` (a user's own,
    a test double) is taken as one that does not know its context: no budget, its own errors decide."""
    return getattr(sampler, "context", None)


def model_positions(model_config: Any) -> int | None:
    """The positions a HF model config says the model has (None: it does not say)."""
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        v = getattr(model_config, name, None)
        if isinstance(v, int) and v > 1:
            return v
    return None


def budget_for(
    model_config: Any, max_context: int | None = None, overflow: Overflow = "fail", engine_limit: int | None = None
) -> ContextBudget:
    """The run's budget: the smallest of the model's positions, the config's `sampling.max_context` and the
    engine's own limit (vLLM's max_model_len); UNKNOWN_CONTEXT when none of them says."""
    limits = [v for v in (model_positions(model_config), max_context, engine_limit) if v]
    return ContextBudget(max_context=min(limits) if limits else UNKNOWN_CONTEXT, overflow=overflow)


def run_budget(cfg: Any, model: Any, engine_limit: int | None = None) -> ContextBudget:
    """The budget a run's sampler keeps: `model`'s positions, the config's sampling.max_context and
    sampling.context_overflow, and the engine's own limit when it has one."""
    return budget_for(text_config(model), cfg.sampling.max_context, cfg.sampling.context_overflow, engine_limit)


def text_config(model: Any) -> Any:
    """The config that holds a language model's positions (under peft, the base model's; a multimodal config keeps
    them in its text part)."""
    cfg = getattr(model, "config", None)
    get = getattr(cfg, "get_text_config", None)
    return get() if callable(get) else cfg
