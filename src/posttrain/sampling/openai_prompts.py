"""How a request to the OpenAI-compatible server (sampling/openai_server.py) becomes what the sampler is called
with: the server's state (`ServerState`), the checks of a request against its limits (`RequestLimits`) and of what
this server cannot do (tools other than functions, content other than text: refused, naming the field), and its
prompt ids and max_tokens, rendered, tokenized and fitted to the sampler's context. Separate from the server's
routes, which only call these and shape the answers; the request schemas and errors are openai_requests.py's."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from posttrain.sampling.base import Sampler
from posttrain.sampling.chat_prompt import ChatRenderer
from posttrain.sampling.context import ContextBudget, ContextOverflow
from posttrain.sampling.openai_requests import (
    MIN_TEMPERATURE,
    BadRequest,
    ChatRequest,
    ContextLengthExceeded,
    RequestLimits,
    SamplingRequest,
)
from posttrain.sampling.recorder import RolloutRecorder
from posttrain.sampling.reply_parsers import ReplyParsers
from posttrain.sampling.response_store import ResponseStore
from posttrain.types import SampleParams

T = TypeVar("T")


@dataclass
class ServerState:
    sampler: Sampler
    tokenizer: Any
    model_name: str
    recorder: RolloutRecorder
    request_timeout_s: float
    default_max_tokens: int
    renderer: ChatRenderer
    limits: RequestLimits = field(default_factory=RequestLimits)
    max_token_chars: int | None = None  # the longest token's characters: a prompt has >= chars / this tokens
    cpu: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(2, thread_name_prefix="serve-cpu"))
    stats: dict[str, int] = field(default_factory=lambda: {"requests": 0, "timeouts": 0, "errors": 0})
    responses: ResponseStore = field(default_factory=ResponseStore)  # /v1/responses' previous_response_id
    replies: ReplyParsers | None = None  # how replies are read (reply_parsers.py); None: the template's family

    @property
    def context(self) -> ContextBudget | None:
        return self.sampler.context

    async def off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` in a worker thread: the event loop (and /health) keeps answering meanwhile."""
        return await asyncio.get_running_loop().run_in_executor(self.cpu, fn, *args)


# Content parts a text model cannot read: refused, not dropped (a dropped image leaves a question about nothing).
NON_TEXT_PARTS = frozenset({"image_url", "input_image", "input_audio", "input_file", "file", "audio"})


def reject_echo(echo: bool) -> None:
    """BadRequest for `echo` (this server does not return the prompt with the completion)."""
    if echo:
        raise BadRequest(
            "echo=true is not supported by this server: send echo=false and prepend the prompt yourself "
            "(return_token_ids gives its ids as prompt_token_ids)",
            param="echo",
        )


def check_chat(st: ServerState, body: ChatRequest) -> None:
    """A chat request against the limits, and what this server cannot do named before any work starts: tools
    other than functions, content parts other than text."""
    check_sampling(st, body)
    lim = st.limits.max_messages
    if len(body.messages) > lim:
        raise BadRequest(
            f"{len(body.messages)} messages; this server takes at most {lim} (RequestLimits.max_messages)",
            param="messages",
        )
    if body.tools is not None and len(body.tools) > lim:
        raise BadRequest(f"{len(body.tools)} tools; this server takes at most {lim} (RequestLimits.max_messages)")
    for i, tool in enumerate(body.tools or []):
        kind = tool.get("type", "function")
        if kind != "function":
            raise BadRequest(
                f"tools of type {str(kind)[:50]!r} are not supported: this server runs function tools only "
                '({"type": "function", "function": {"name", "parameters"}}); run the tool in the agent',
                param=f"tools[{i}].type",
            )
    for i, m in enumerate(body.messages):
        parts = m.get("content") if isinstance(m, dict) else None
        for j, part in enumerate(parts if isinstance(parts, list) else []):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind in NON_TEXT_PARTS:
                raise BadRequest(
                    f"content parts of type {kind!r} are not supported: this server's model reads text only; "
                    'send {"type": "text", "text": ...} parts',
                    param=f"messages[{i}].content[{j}].type",
                )


def sample_params(body: SamplingRequest, max_tokens: int) -> SampleParams:
    """The sampler's SampleParams for a request's sampling fields and the max_tokens fitted to the context."""
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    return SampleParams(
        max_tokens=max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
        stop=stop,
        seed=body.seed,
    )


def check_sampling(st: ServerState, body: SamplingRequest) -> None:
    """The sampling parameters against the limits (the schema already made them finite and typed)."""
    lim = st.limits
    if body.n > lim.max_n:
        raise BadRequest(
            f"n={body.n}; this server samples at most {lim.max_n} completions per prompt (posttrain serve --max-n)"
        )
    if body.temperature > lim.max_temperature or 0 < body.temperature < MIN_TEMPERATURE:
        raise BadRequest(
            f"temperature={body.temperature}: use 0 (greedy) or a value in [{MIN_TEMPERATURE}, {lim.max_temperature}]"
        )
    stops = [body.stop] if isinstance(body.stop, str) else (body.stop or [])
    if len(stops) > lim.max_stop:
        raise BadRequest(f"{len(stops)} stop strings; this server takes at most {lim.max_stop}")
    if sum(len(x) for x in stops) > lim.max_stop_chars:
        raise BadRequest(
            f"the stop strings have {sum(len(x) for x in stops)} characters together; this server "
            f"takes at most {lim.max_stop_chars}"
        )


def text_chars(value: Any, cap: int) -> int:
    """Characters of every string (keys included) in a JSON value, walked without recursion; stops counting past
    `cap`."""
    total, stack = 0, [value]
    while stack and total <= cap:
        v = stack.pop()
        if isinstance(v, str):
            total += len(v)
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return total


def _check_chars(st: ServerState, chars: int, what: str) -> None:
    if chars > st.limits.max_chars:
        raise BadRequest(f"the {what} have more than {st.limits.max_chars} characters (posttrain serve --max-chars)")


def _fits_by_length(st: ServerState, chars: int, max_tokens: int, explicit: bool) -> None:
    """Refuse, without tokenizing, a text certainly too long for the context: it has at least chars / (the
    longest token's characters) tokens."""
    budget = st.context
    if budget is None or not st.max_token_chars:
        return
    at_least = -(-chars // st.max_token_chars)
    wanted = max_tokens if explicit else 1
    try:
        budget.fit(at_least, wanted)
    except ContextOverflow:
        raise ContextLengthExceeded(
            f"this model's maximum context length is {budget.max_context} tokens; the prompt alone has "
            f"{chars} characters, at least {at_least} tokens, and the completion asks for {wanted}. Shorten the "
            "prompt or lower max_tokens"
        ) from None


def fit_max_tokens(st: ServerState, prompts_P: list[list[int]], max_tokens: int, explicit: bool) -> int:
    """The max_tokens the call samples with: as asked when it fits the context; cut to fit under
    `overflow == "truncate"` (ContextBudget.fit); the server's default (not `explicit`) cut to what the longest
    prompt leaves; else ContextLengthExceeded."""
    budget = st.context
    if budget is None or not prompts_P:
        return max_tokens
    longest = max(len(p) for p in prompts_P)
    if not explicit and budget.room(longest) >= 1:
        return min(max_tokens, budget.room(longest))
    try:
        return budget.fit(longest, max_tokens)
    except ContextOverflow:
        raise ContextLengthExceeded(
            f"this model's maximum context length is {budget.max_context} tokens; the request asks for "
            f"{longest + max_tokens} ({longest} in the prompt, {max_tokens} in the completion). Shorten the prompt "
            "or lower max_tokens"
        ) from None


def chat_prompt(st: ServerState, body: ChatRequest, prev: Any, asked: int | None) -> tuple[list[int], int]:
    """(prompt ids, max_tokens) of a chat request: in a worker thread (the char count, the template, the
    tokenizer)."""
    _check_chars(
        st,
        text_chars(body.messages, st.limits.max_chars) + text_chars(body.tools, st.limits.max_chars),
        "messages and tools",
    )
    max_tokens = asked or st.default_max_tokens
    try:
        text = st.renderer.text(body.messages, body.tools, add_generation_prompt=True)
        _fits_by_length(st, len(text), max_tokens, asked is not None)
        prompt_ids = (st.renderer.splice(prev, body.messages, body.tools) if prev else None) or st.renderer.encode(text)
    except BadRequest:
        raise
    except MemoryError:
        raise
    except Exception as e:  # noqa: BLE001 - bad messages, or the template rejected them (jinja's own errors too)
        raise BadRequest(f"cannot render messages with the chat template: {type(e).__name__}: {e}") from None
    return prompt_ids, fit_max_tokens(st, [prompt_ids], max_tokens, asked is not None)


def completion_prompts(st: ServerState, prompt: Any, max_tokens: int, explicit: bool) -> tuple[list[list[int]], int]:
    """(prompts as token ids, max_tokens) of a /v1/completions request: in a worker thread."""
    if isinstance(prompt, str):
        prompts: list[Any] = [prompt]
    elif prompt and all(isinstance(x, int) for x in prompt):
        prompts = [prompt]
    else:
        prompts = list(prompt)
    if not prompts:
        raise BadRequest("prompt is empty")
    if len(prompts) > st.limits.max_prompts:
        raise BadRequest(f"{len(prompts)} prompts in one call; this server takes at most {st.limits.max_prompts}")
    _check_chars(st, sum(len(p) for p in prompts if isinstance(p, str)), "text prompts")
    for p in prompts:  # every prompt checked before any is tokenized
        if isinstance(p, str):
            _fits_by_length(st, len(p), max_tokens, explicit)
        else:
            fit_max_tokens(st, [p], max_tokens, explicit)
    vocab = len(st.tokenizer)
    out = []
    for p in prompts:
        ids = (
            [int(i) for i in st.tokenizer(p, add_special_tokens=False)["input_ids"]] if isinstance(p, str) else list(p)
        )
        if not ids:
            raise BadRequest("a prompt has no tokens")
        bad = [i for i in ids if not 0 <= i < vocab]
        if bad:
            raise BadRequest(f"prompt token ids out of range [0, {vocab}): {bad[:5]}")
        out.append(ids)
    return out, fit_max_tokens(st, out, max_tokens, explicit)


def longest_token_chars(tokenizer: Any) -> int | None:
    """The most characters one token of `tokenizer` stands for (its vocabulary's longest entry: a byte-level
    entry has one character per byte, so this bounds the characters of text too); None when unknown."""
    try:
        longest = max((len(t) for t in tokenizer.get_vocab()), default=0)
    except Exception:  # noqa: BLE001 - a tokenizer without a vocabulary to read: no early check
        return None
    return longest or None
