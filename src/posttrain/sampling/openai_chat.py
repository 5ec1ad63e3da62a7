"""One chat call of the OpenAI-compatible server, shared by /v1/chat/completions (openai_server.py) and
/v1/responses (openai_responses.py): the request checked, its prompt rendered (spliced onto the rollout's earlier
sampled tokens where it continues them), sampled under the server's timeout, the replies parsed for tool calls
and recorded under the rollout id.

What a request makes of the reply (`output_plan`): `response_format` json_schema / json_object holds decoding to the
schema (a `Constraint` in SampleParams: sampling/constrained.py); `tool_choice` "required" or a named function
forces the opening of a call in the model family's format (tool_parsers.forced_opening, the function's name in it
when named) and holds the rest of the call to the tool's parameters. The forced opening was not sampled, so it goes
on the PROMPT side of the call: the recorder trains only on the sampled tokens, the next turn's prompt (the
assistant message re-rendered with the whole call) still extends prompt + completion, and the client gets the
opening + the sampled text, parsed for calls as usual.

A streamed call and a non-streamed one go through here alike, so the recorder holds the same token ids, logprobs
and policy version whichever way the answer travels; only its shape differs.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from dataclasses import dataclass, replace
from typing import Any

from posttrain.sampling.constrained import (
    ConstraintError,
    check_constraint,
    json_constraint,
    tool_call_grammar,
)
from posttrain.sampling.context import OVERFLOW, ContextOverflow
from posttrain.sampling.openai_prompts import ServerState, chat_prompt, check_chat, fit_max_tokens, sample_params
from posttrain.sampling.openai_requests import (
    BadRequest,
    ChatRequest,
    ContextLengthExceeded,
    HTTPError,
    SamplingRequest,
)
from posttrain.sampling.recorder import RecordedCall
from posttrain.sampling.reply_parsers import ParsedMessage, ReplyParsers, tool_schemas
from posttrain.sampling.tool_parsers import forced_opening
from posttrain.types import Completion, Constraint, SampleParams

log = logging.getLogger(__name__)


@dataclass
class ChatReply:
    completion: Completion
    message: dict[str, Any]  # the assistant message: role, content, tool_calls (OpenAI's chat shape)
    finish_reason: str  # OpenAI's: "tool_calls" where the reply stopped after calls


@dataclass
class ChatRun:
    prompt_ids: list[int]  # what the sampler was given: the rendered prompt, then any forced opening
    replies: list[ChatReply]


@dataclass(frozen=True)
class OutputPlan:
    """What a request holds its replies to: `opening` forced before the sampled text (on the prompt side), the
    rest of the reply under `constraint`."""

    opening: str = ""
    constraint: Constraint | None = None


MAX_FORMAT_NAME = 256  # characters of a function name in tool_choice (OpenAI's own cap is 64)


def _named(choice: dict[str, Any]) -> str:
    """The function a tool_choice object names: chat's {"type": "function", "function": {"name"}} or Responses'
    flat {"type": "function", "name"}."""
    inner = choice.get("function")
    name = (inner if isinstance(inner, dict) else choice).get("name")
    if choice.get("type", "function") != "function" or not isinstance(name, str) or not name:
        raise BadRequest(
            'tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}',
            param="tool_choice",
        )
    return name[: MAX_FORMAT_NAME + 1]


def output_plan(st: ServerState, body: ChatRequest) -> OutputPlan:
    """The forced opening and the constraint a request asks for (see the module docstring); BadRequest for a
    tool_choice or response_format this server cannot honour. In a worker thread (compiling a grammar)."""
    choice = body.tool_choice
    if isinstance(choice, str) and choice not in ("none", "auto", "required"):
        raise BadRequest(f"tool_choice {choice[:50]!r} is not one of none, auto, required", param="tool_choice")
    fmt = _format_constraint(body.response_format)
    if choice in (None, "none", "auto"):
        return OutputPlan(constraint=fmt)
    schemas = tool_schemas(body.tools)
    name = _named(choice) if isinstance(choice, dict) else None
    fns = [t.get("function", t) for t in body.tools or [] if isinstance(t, dict)]
    names = [f["name"] for f in fns if isinstance(f, dict) and isinstance(f.get("name"), str)]
    if not names or name is not None and name not in names:
        what = f"names function {name[:64]!r}, which is not in tools" if name else '"required" needs tools'
        raise BadRequest(f"tool_choice {what}", param="tool_choice")
    if fmt is not None:
        raise BadRequest("send tool_choice or response_format, not both: a forced call is JSON already")
    if st.replies is None:
        st.replies = ReplyParsers(st.tokenizer)
    family = st.replies.tool.name
    grammar = tool_call_grammar(family, {n: schemas.get(n, {}) for n in names}, name)
    return OutputPlan(forced_opening(family, name), grammar)


def _format_constraint(fmt: dict[str, Any] | None) -> Constraint | None:
    """response_format as a constraint: {"type": "text"} (None), "json_object", or "json_schema" with its
    {"json_schema": {"name", "schema", "strict"}} (chat's shape; a Responses text.format is turned into it)."""
    kind = fmt.get("type") if fmt is not None else "text"
    try:
        if kind == "text":
            return None
        if kind == "json_object":
            c = json_constraint(None)
        elif kind == "json_schema":
            spec = fmt.get("json_schema") if fmt is not None else None
            schema = spec.get("schema", {}) if isinstance(spec, dict) else None
            if not isinstance(schema, dict | bool):
                raise BadRequest(
                    'response_format json_schema needs {"json_schema": {"name": ..., "schema": {...}}}',
                    param="response_format.json_schema",
                )
            c = json_constraint(schema)
        else:
            raise BadRequest(
                f"response_format type {str(kind)[:50]!r} is not one of text, json_object, json_schema",
                param="response_format.type",
            )
        check_constraint(c)
    except ConstraintError as e:
        raise BadRequest(str(e), param="response_format") from None
    return c


async def run_chat(st: ServerState, body: ChatRequest, rid: str | None) -> ChatRun:
    """Check, render, sample, parse and record one chat request (`rid`: the rollout id, None: not recorded)."""
    check_chat(st, body)
    plan = await st.off_loop(output_plan, st, body)
    prev = st.recorder.last(rid) if rid else None
    asked = body.max_completion_tokens or body.max_tokens
    prompt_ids, max_tokens = await st.off_loop(chat_prompt, st, body, prev, asked)
    if plan.opening:
        prompt_ids = prompt_ids + st.renderer.encode(plan.opening)
        max_tokens = fit_max_tokens(st, [prompt_ids], max_tokens, asked is not None)
    params = replace(sample_params(body, max_tokens), constraint=plan.constraint)
    (comps,) = await sample(st, [prompt_ids], params, body.n)
    parse = bool(body.tools) and body.tool_choice != "none"
    if st.replies is None:
        st.replies = ReplyParsers(st.tokenizer)
    schemas = tool_schemas(body.tools) if parse else None
    replies = [_reply(c, _parsed(st.replies, c, prompt_ids, parse, schemas, plan.opening)) for c in comps]
    if rid:
        for r in replies:
            st.recorder.record(rid, _recorded(prompt_ids, r, body, plan.opening + r.completion.text))
    return ChatRun(prompt_ids, replies)


def _parsed(
    rp: ReplyParsers, c: Completion, prompt_ids: list[int], parse: bool, schemas: Any, opening: str
) -> ParsedMessage:
    """The reply as the client reads it: the forced opening (the prompt's last tokens), then the sampled text,
    read for calls (the sampled text's special-token markers put back first: they line up with its ids only)."""
    if not opening:
        return rp.parse(c, prompt_ids, parse, schemas)
    reasoning, content = rp.split(c, prompt_ids, parse)
    content, calls, errors = rp.tool.parse(opening + content, schemas)
    return ParsedMessage(reasoning, content, calls, errors)


def _recorded(prompt_ids: list[int], r: ChatReply, body: ChatRequest, text: str) -> RecordedCall:
    c = r.completion
    return RecordedCall(
        prompt_ids,
        c.token_ids,
        c.logprobs,
        c.policy_version,
        c.finish_reason,
        text=text,
        messages=body.messages,
        tools=body.tools,
        reply=r.message,
        token_versions=c.token_versions,
    )


def _reply(c: Completion, parsed: ParsedMessage) -> ChatReply:
    content, calls = parsed.content, parsed.calls
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if parsed.reasoning is not None:  # the model family's reasoning block (reply_parsers.py), vLLM's field name
        message["reasoning_content"] = parsed.reasoning
    finish = c.finish_reason
    if calls:
        message["tool_calls"] = [
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {"name": x["name"], "arguments": json.dumps(x["arguments"])},
            }
            for x in calls
        ]
        finish = "tool_calls" if finish == "stop" else finish
    return ChatReply(c, message, finish)


def chat_completion(st: ServerState, body: ChatRequest, run: ChatRun) -> dict[str, Any]:
    """The `chat.completion` object of a run (streaming cuts this same object into chunks)."""
    choices = []
    for i, r in enumerate(run.replies):
        c = r.completion
        choice: dict[str, Any] = {"index": i, "message": r.message, "finish_reason": r.finish_reason, "logprobs": None}
        if body.logprobs:
            choice["logprobs"] = {"content": token_logprobs(st, c, body)}
        if body.return_token_ids:
            choice["token_ids"] = c.token_ids
        choices.append(choice)
    out = envelope("chat.completion", st, [run.prompt_ids], [[r.completion for r in run.replies]], choices)
    if body.return_token_ids:
        out["prompt_token_ids"] = run.prompt_ids
    return out


def token_logprobs(st: ServerState, c: Completion, body: SamplingRequest) -> list[dict[str, Any]]:
    """Each sampled token's logprob as OpenAI's chat logprobs write it (no top_logprobs: only the sampled one's)."""
    return [
        {"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
        for t, lp in zip(token_strs(st, c.token_ids, body), c.logprobs)
    ]


async def sample(st: ServerState, prompts_P: list[list[int]], params: SampleParams, n: int) -> list[list[Completion]]:
    """The sampler called under the server's timeout; its refusals as OpenAI's errors."""
    st.stats["requests"] += 1
    try:
        out = await asyncio.wait_for(st.sampler.sample(prompts_P, params, n=n), st.request_timeout_s)
    except TimeoutError:
        st.stats["timeouts"] += 1
        log.warning(
            "sampler call timed out after %.1fs (%d timeouts so far)", st.request_timeout_s, st.stats["timeouts"]
        )
        raise HTTPError(504, f"sampling timed out after {st.request_timeout_s}s") from None
    except ContextOverflow as e:  # the sampler's own check (a budget tighter than the one read here)
        st.stats["errors"] += 1
        raise ContextLengthExceeded(str(e)) from None
    except ValueError as e:  # the sampler rejected the request (empty prompt, bad max_tokens, ...)
        st.stats["errors"] += 1
        raise BadRequest(str(e)) from None
    refused = next((c.error for g in out for c in g if c.finish_reason == OVERFLOW), None)
    if refused is not None:  # one prompt of several past the sampler's budget: the request fails, as before
        st.stats["errors"] += 1
        raise ContextLengthExceeded(refused)
    return out


def token_strs(st: ServerState, ids: list[int], body: SamplingRequest) -> list[str]:
    if body.return_tokens_as_token_ids:
        return [f"token_id:{i}" for i in ids]
    return [st.tokenizer.decode([i]) for i in ids]


def envelope(
    obj: str, st: ServerState, prompts_P: list[list[int]], groups: list[list[Completion]], choices: list[dict[str, Any]]
) -> dict[str, Any]:
    n_completion = sum(len(c.token_ids) for g in groups for c in g)
    n_prompt = sum(len(p) for p in prompts_P)
    prefix = "chatcmpl" if obj == "chat.completion" else "cmpl"
    return {
        "id": f"{prefix}-{uuid.uuid4().hex}",
        "object": obj,
        "created": int(time.time()),
        "model": st.model_name,
        "choices": choices,
        "policy_version": min((c.policy_version for g in groups for c in g), default=0),
        "usage": {
            "prompt_tokens": n_prompt,
            "completion_tokens": n_completion,
            "total_tokens": n_prompt + n_completion,
        },
    }
