"""The context budget: one rule, for every engine, that keeps each prompt and its completion within the model's
context.

    budget = ContextBudget(max_context=2048)                    the model's (or the engine's) positions
    params = budget.fit_call(prompts_P, params)                 before any sampling call: raises ContextOverflow
                                                                (or, overflow="truncate", cuts max_tokens to fit)
    fitted = budget.fit_rows(prompts_P, params)                 the same, row by row: what every sampler does
    out = fitted.merge(await engine(fitted.prompts_P, fitted.params, n), n)

Why before the call: a vLLM engine (in process or a server) refuses a whole `generate` call when one of its rows
does not fit, so one long episode would take every row coalesced with it down; the own decode loop would decode
past the model's positions without a word. Checking each caller's rows before they are coalesced
(sampling/coalesce.py) fails only the row whose prompt does not fit, with the numbers in the message:

    a call of one prompt            ContextOverflow, as it always was (every env's call: the sample fails alone)
    a call of several prompts       the rows that fit are sampled; each row that does not comes back as n
                                    completions with finish_reason "context_overflow", no tokens, `error` the reason
    none of them fits               ContextOverflow (nothing was sampled)

Multi-turn envs read the sampler's budget turn by turn (`room`), so an episode that grows past the context ends
with a context stop and is trained on as truncated, instead of failing at the sampler (envs/tool_env.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal

from posttrain.types import Completion, SampleParams

Overflow = Literal["fail", "truncate"]
OVERFLOW = "context_overflow"  # the finish_reason of a row that did not fit (a call of several prompts)

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

    def fit_rows(self, prompts_P: list[list[int]], params: SampleParams) -> FittedRows:
        """Each prompt fitted on its own: the prompts that fit (with `fit_call`'s params for them) and, for each
        one that does not, its ContextOverflow. Raises that ContextOverflow when the call has one prompt, or none of
        its prompts fits: there is nothing to sample."""
        refused: dict[int, ContextOverflow] = {}
        for i, p in enumerate(prompts_P):
            try:
                self.fit(len(p), params.max_tokens)
            except ContextOverflow as e:
                refused[i] = e
        if refused and len(refused) == len(prompts_P):
            raise max(refused.values(), key=lambda e: e.prompt_tokens)
        kept = [p for i, p in enumerate(prompts_P) if i not in refused]
        return FittedRows(kept, self.fit_call(kept, params), refused, len(prompts_P))


@dataclass(frozen=True)
class FittedRows:
    """One sampling call fitted row by row (`ContextBudget.fit_rows`): sample `prompts_P` with `params`, then
    `merge` puts each refused row back in its place."""

    prompts_P: list[list[int]]  # the prompts that fit, in order
    params: SampleParams  # theirs: max_tokens cut under truncate to what the longest of them leaves
    refused: dict[int, ContextOverflow] = field(default_factory=dict)  # position in the call -> why it did not fit
    total: int = 0  # prompts in the call

    def merge(self, served_P: list[list[Completion]], n: int) -> list[list[Completion]]:
        """The call's result in its order: `served_P` (one group per prompt that fit) with n overflow completions
        at each refused row's place. Those carry the version the served rows were sampled under."""
        if not self.refused:
            return served_P
        version = min((c.policy_version for g in served_P for c in g), default=0)
        served = iter(served_P)
        return [
            [overflow_completion(self.refused[i], version) for _ in range(n)] if i in self.refused else next(served)
            for i in range(self.total)
        ]


def overflow_completion(e: ContextOverflow, policy_version: int) -> Completion:
    """The completion of a row that did not fit: no tokens, finish_reason "context_overflow", the reason."""
    return Completion([], [], OVERFLOW, policy_version, error=str(e))


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
