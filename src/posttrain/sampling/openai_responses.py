"""POST /v1/responses: OpenAI's Responses API (what the OpenAI Agents SDK's default model speaks) over the same
chat call as /v1/chat/completions (openai_chat.py), so a response is rendered with the chat template, spliced onto
the rollout's earlier sampled tokens and recorded with token ids exactly as a chat call is.

A request becomes chat messages: `instructions` as the system message, then the conversation stored under
`previous_response_id` (if any), then `input` (openai_responses_input.py). The reply becomes output items: its
reasoning (the reasoning parser's, reasoning_parsers.py) as a `reasoning` item first (`content`: one
`reasoning_text` part; `summary` empty), a `message` with one `output_text` part (left out when the reply is only
tool calls), then a `function_call` item (`call_id`, `name`, `arguments`) per parsed call. A `reasoning` item sent
back in a later request's input is that turn's reasoning_content again. `max_output_tokens` is max_tokens; a reply
cut there is `status: "incomplete"` with `incomplete_details.reason: "max_output_tokens"`, as OpenAI's. `include:
["message.output_text.logprobs"]` adds the sampled tokens' logprobs to the output_text.

`previous_response_id`: every response with `store` (the default) keeps its conversation (input history and the
reply, without the instructions, which OpenAI does not carry over either) in `ServerState.responses`, a
ResponseStore (response_store.py): the 4096 most recently used responses, 64M characters together, per server.
An unknown or evicted id is refused (400, param `previous_response_id`, code `previous_response_not_found`).

Streaming (`stream: true`): the answer is made first (openai_stream.py says why), then sent as OpenAI's events,
each `event: <type>` + `data: <json>` with a `sequence_number` from 0: response.created, response.in_progress;
per output item response.output_item.added, then for a message response.content_part.added,
response.output_text.delta (pieces), response.output_text.done, response.content_part.done, or for a call
response.function_call_arguments.delta (pieces) and .done, or for reasoning response.reasoning_text.delta and
.done; response.output_item.done; last response.completed
(response.incomplete for a reply cut at max_output_tokens).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

from posttrain.sampling.openai_chat import ChatRun, run_chat, token_logprobs
from posttrain.sampling.openai_prompts import ServerState, text_chars
from posttrain.sampling.openai_requests import BadRequest, ChatRequest
from posttrain.sampling.openai_responses_input import (
    ResponsesRequest,
    chat_request,
    chat_tools,
    flat_tools,
    input_messages,
    refuse_unsupported,
)
from posttrain.sampling.openai_stream import pieces, sse, sse_response


async def create_response(st: ServerState, body: ResponsesRequest, header_rid: str | None) -> Any:
    refuse_unsupported(body)
    history: list[dict[str, Any]] = []
    if body.previous_response_id is not None:
        stored = st.responses.get(body.previous_response_id)
        if stored is None:
            raise BadRequest(
                f"Previous response with id {body.previous_response_id[:100]!r} not found: this server keeps the "
                f"{st.responses.max_responses} most recently used responses with store=true, for as long as it "
                "runs; send the whole history as input instead",
                code="previous_response_not_found",
                param="previous_response_id",
            )
        history = stored
    tools = chat_tools(body.tools)
    new = input_messages(body.input, st.limits.max_messages)
    system = [{"role": "system", "content": body.instructions}] if body.instructions else []
    if not (system or history or new):
        raise BadRequest("input is empty: send a string or a list of input items", param="input")
    chat = chat_request(body, system + history + new, tools)
    run = await run_chat(st, chat, header_rid or body.rollout_id)
    resp = response_object(st, body, chat, run)
    if body.store is not False:
        kept = history + new + [run.replies[0].message]
        st.responses.put(resp["id"], kept, text_chars(kept, st.responses.max_chars + 1))
    if body.stream:
        return sse_response(sse(e, e["type"]) for e in response_events(resp))
    return resp


def _output(st: ServerState, run: ChatRun, chat: ChatRequest) -> list[dict[str, Any]]:
    (reply,) = run.replies
    status = "incomplete" if reply.finish_reason == "length" else "completed"
    calls = reply.message.get("tool_calls") or []
    items: list[dict[str, Any]] = []
    reasoning = reply.message.get("reasoning_content")
    if isinstance(reasoning, str):
        items.append(
            {
                "id": f"rs_{uuid.uuid4().hex}",
                "type": "reasoning",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": reasoning}],
                "status": status,
            }
        )
    content = reply.message["content"] or ""
    if content or not calls:
        part: dict[str, Any] = {"type": "output_text", "text": content, "annotations": []}
        if chat.logprobs:
            part["logprobs"] = token_logprobs(st, reply.completion, chat)
        message = {"id": f"msg_{uuid.uuid4().hex}", "type": "message", "role": "assistant", "status": status}
        items.append({**message, "content": [part]})
    for call in calls:
        fn = call["function"]
        items.append(
            {
                "id": f"fc_{uuid.uuid4().hex}",
                "type": "function_call",
                "call_id": call["id"],
                "name": fn["name"],
                "arguments": fn["arguments"],
                "status": "completed",
            }
        )
    return items


def response_object(st: ServerState, body: ResponsesRequest, chat: ChatRequest, run: ChatRun) -> dict[str, Any]:
    """The `response` object of a finished run (streaming sends this same object, piece by piece)."""
    (reply,) = run.replies
    c = reply.completion
    incomplete = reply.finish_reason == "length"
    n_in, n_out = len(run.prompt_ids), len(c.token_ids)
    return {
        "id": f"resp_{uuid.uuid4().hex}",
        "object": "response",
        "created_at": int(time.time()),
        "status": "incomplete" if incomplete else "completed",
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "model": st.model_name,
        "output": _output(st, run, chat),
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "previous_response_id": body.previous_response_id,
        "reasoning": None,
        "store": body.store is not False,
        "temperature": 1.0 if body.temperature is None else body.temperature,
        "text": body.text or {"format": {"type": "text"}},  # the format it was held to, as OpenAI echoes it
        "tool_choice": body.tool_choice or "auto",
        "tools": flat_tools(chat_tools(body.tools)),
        "top_p": 1.0 if body.top_p is None else body.top_p,
        "truncation": "disabled",
        "usage": {
            "input_tokens": n_in,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": n_out,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": n_in + n_out,
        },
        "user": None,
        "metadata": body.metadata or {},
        "policy_version": c.policy_version,
    }


def response_events(resp: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The stream events of a finished `response` object, numbered from 0 (see the module docstring)."""
    seq = iter(range(1 << 62))
    start = {**resp, "status": "in_progress", "output": [], "usage": None, "incomplete_details": None}
    yield {"type": "response.created", "sequence_number": next(seq), "response": start}
    yield {"type": "response.in_progress", "sequence_number": next(seq), "response": start}
    for index, item in enumerate(resp["output"]):
        for event in _item_events(index, item):
            yield {**event, "sequence_number": next(seq)}
    last = "response.incomplete" if resp["status"] == "incomplete" else "response.completed"
    yield {"type": last, "sequence_number": next(seq), "response": resp}


def _item_events(index: int, item: dict[str, Any]) -> Iterator[dict[str, Any]]:
    at = {"item_id": item["id"], "output_index": index}
    if item["type"] == "reasoning":
        yield {"type": "response.output_item.added", "output_index": index, "item": {**item, "content": []}}
        text = item["content"][0]["text"]
        for piece in pieces(text):
            yield {"type": "response.reasoning_text.delta", **at, "content_index": 0, "delta": piece}
        yield {"type": "response.reasoning_text.done", **at, "content_index": 0, "text": text}
    elif item["type"] == "message":
        yield {
            "type": "response.output_item.added",
            "output_index": index,
            "item": {**item, "status": "in_progress", "content": []},
        }
        (part,) = item["content"]
        empty = {**part, "text": ""}
        if "logprobs" in part:
            empty["logprobs"] = []
        yield {"type": "response.content_part.added", **at, "content_index": 0, "part": empty}
        for i, piece in enumerate(pieces(part["text"])):
            lps = part.get("logprobs", []) if i == 0 else []
            yield {"type": "response.output_text.delta", **at, "content_index": 0, "delta": piece, "logprobs": lps}
        yield {
            "type": "response.output_text.done",
            **at,
            "content_index": 0,
            "text": part["text"],
            "logprobs": part.get("logprobs", []),
        }
        yield {"type": "response.content_part.done", **at, "content_index": 0, "part": part}
    else:
        yield {
            "type": "response.output_item.added",
            "output_index": index,
            "item": {**item, "status": "in_progress", "arguments": ""},
        }
        for piece in pieces(item["arguments"]):
            yield {"type": "response.function_call_arguments.delta", **at, "delta": piece}
        yield {
            "type": "response.function_call_arguments.done",
            **at,
            "name": item["name"],
            "arguments": item["arguments"],
        }
    yield {"type": "response.output_item.done", "output_index": index, "item": item}
