"""One chat call of the OpenAI-compatible server, shared by /v1/chat/completions (openai_server.py) and
/v1/responses (openai_responses.py): the request checked, its prompt rendered (spliced onto the rollout's earlier
sampled tokens where it continues them), sampled under the server's timeout, the replies parsed for tool calls
and recorded under the rollout id. A streamed call and a non-streamed one go through here alike, so the recorder
holds the same token ids, logprobs and policy version whichever way the answer travels; only its shape differs.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any

from posttrain.sampling.context import OVERFLOW, ContextOverflow
from posttrain.sampling.openai_prompts import ServerState, _chat_prompt, _params, check_chat
from posttrain.sampling.openai_requests import BadRequest, ChatRequest, ContextLengthExceeded, HTTPError, _Sampling
from posttrain.sampling.recorder import RecordedCall
from posttrain.sampling.reply_parsers import ParsedMessage, ReplyParsers, tool_schemas
from posttrain.types import Completion, SampleParams

log = logging.getLogger(__name__)


@dataclass
class ChatReply:
    completion: Completion
    message: dict[str, Any]  # the assistant message: role, content, tool_calls (OpenAI's chat shape)
    finish_reason: str  # OpenAI's: "tool_calls" where the reply stopped after calls


@dataclass
class ChatRun:
    prompt_ids: list[int]
    replies: list[ChatReply]


async def run_chat(st: ServerState, body: ChatRequest, rid: str | None) -> ChatRun:
    """Check, render, sample, parse and record one chat request (`rid`: the rollout id, None: not recorded)."""
    check_chat(st, body)
    prev = st.recorder.last(rid) if rid else None
    asked = body.max_completion_tokens or body.max_tokens
    prompt_ids, max_tokens = await st.off_loop(_chat_prompt, st, body, prev, asked)
    (comps,) = await sample(st, [prompt_ids], _params(body, max_tokens), body.n)
    parse = bool(body.tools) and body.tool_choice != "none"
    if st.replies is None:
        st.replies = ReplyParsers(st.tokenizer)
    schemas = tool_schemas(body.tools) if parse else None
    replies = [_reply(c, st.replies.parse(c, prompt_ids, parse, schemas)) for c in comps]
    if rid:
        for r in replies:
            st.recorder.record(rid, _recorded(prompt_ids, r, body))
    return ChatRun(prompt_ids, replies)


def _recorded(prompt_ids: list[int], r: ChatReply, body: ChatRequest) -> RecordedCall:
    c = r.completion
    return RecordedCall(
        prompt_ids,
        c.token_ids,
        c.logprobs,
        c.policy_version,
        c.finish_reason,
        text=c.text,
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


def token_logprobs(st: ServerState, c: Completion, body: _Sampling) -> list[dict[str, Any]]:
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


def token_strs(st: ServerState, ids: list[int], body: _Sampling) -> list[str]:
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
