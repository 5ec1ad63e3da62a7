"""What a /v1/responses request may be (sampling/openai_responses.py) and how it becomes a chat request: the
schema, the fields this server refuses (each named, with what to use instead), the `input` items as chat
messages and the flat Responses tools as chat tools.

Input items, in order:

    a string                         one user message
    {"role", "content"}              a message (`type: "message"` optional); role user, system, developer (read
                                     as system) or assistant; content a string or parts input_text / output_text /
                                     text / refusal; image, audio and file parts are refused (the model reads text)
    {"type": "function_call"}        `call_id`, `name`, `arguments` (a JSON string): a call of the assistant turn
                                     before it, or an assistant turn of its own
    {"type": "function_call_output"} `call_id`, `output` (a string or text parts): a tool message
    {"type": "reasoning"}            the reasoning (`content` reasoning_text parts) of the assistant turn after it:
                                     its message's `reasoning_content` (the chat template decides whether to render
                                     it); one with no turn after it is dropped
    anything else                    refused: item_reference (send the item or use previous_response_id),
                                     OpenAI-hosted tool calls (web search, computer use, ...)

Refused fields: tools other than functions (web_search, file_search, ... run on OpenAI's side), `background`,
`conversation`, `prompt` (stored prompts) and `truncation: "auto"`. Enforced as on the chat route
(openai_chat.py `output_plan`): `tool_choice` ("required" or a named function `{"type": "function", "name"}`) and
`text.format` (json_schema `{"type", "name", "schema", "strict"}` or json_object, as chat's `response_format`).
Accepted, not enforced: `parallel_tool_calls`, `reasoning`.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from posttrain.sampling.openai_prompts import NON_TEXT_PARTS
from posttrain.sampling.openai_requests import BadRequest, ChatRequest

TEXT_PARTS = frozenset({"input_text", "output_text", "text", "refusal"})
ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}


class ResponsesRequest(BaseModel):
    # Unknown fields (user, metadata keys, text, reasoning, ...) are accepted and ignored, as on the chat route.
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)
    model: str | None = None
    input: str | list[Any] = ""
    instructions: str | None = None
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    text: dict[str, Any] | None = None  # {"format": {...}}: read as chat's response_format (`response_format`)
    previous_response_id: str | None = Field(None, max_length=256)
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = None  # checked as the chat route checks it (the ChatRequest built from this)
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stream: bool = False
    store: bool | None = None  # None: stored, as OpenAI's default
    include: list[str] | None = None
    parallel_tool_calls: bool | None = None
    metadata: dict[str, Any] | None = None
    background: bool | None = None
    conversation: str | dict[str, Any] | None = None
    prompt: dict[str, Any] | None = None
    truncation: str | None = None
    rollout_id: str | None = None


def refuse_unsupported(body: ResponsesRequest) -> None:
    if body.background:
        raise BadRequest(
            "background=true is not supported: this server answers while the request waits; send background=false "
            "(stream=true to see the answer as it is sent)",
            param="background",
        )
    if body.conversation is not None:
        raise BadRequest(
            "conversation is not supported: this server keeps no conversations; continue with "
            "previous_response_id, or send the whole history as input",
            param="conversation",
        )
    if body.prompt is not None:
        raise BadRequest(
            "prompt (a stored prompt template) is not supported: send its text as instructions and input",
            param="prompt",
        )
    if body.truncation not in (None, "disabled"):
        raise BadRequest(
            f"truncation={str(body.truncation)[:50]!r} is not supported: send 'disabled' (the default); an input "
            "past the model's context is refused with code context_length_exceeded",
            param="truncation",
        )


def chat_tools(tools: list[Any] | None) -> list[dict[str, Any]] | None:
    """Responses function tools (`{"type": "function", "name", "parameters", ...}`, flat) as chat tools; a tool
    already in the chat shape (`"function": {...}`) is taken as it is."""
    if not tools:
        return None
    out = []
    for i, t in enumerate(tools):
        kind = t.get("type") if isinstance(t, dict) else None
        if not isinstance(t, dict) or kind != "function":
            raise BadRequest(
                f"tools of type {str(kind)[:50]!r} are not supported: this server runs function tools only "
                '({"type": "function", "name", "parameters"}); hosted tools (web_search, file_search, ...) run on '
                "OpenAI's side: give the agent a function tool that does the work",
                param=f"tools[{i}].type",
            )
        fn = t["function"] if isinstance(t.get("function"), dict) else t
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise BadRequest("a function tool needs a non-empty string 'name'", param=f"tools[{i}].name")
        keep = ("name", "description", "parameters", "strict")
        out.append({"type": "function", "function": {k: fn[k] for k in keep if k in fn}})
    return out


def flat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """Chat tools back in the Responses shape (what a Response echoes in `tools`)."""
    return [{"parameters": None, "strict": None, **t["function"], "type": "function"} for t in tools or []]


def _text(content: Any, where: str) -> str:
    """The text of a message's content or a function_call_output's output: a string or a list of text parts."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if not isinstance(content, list):
        raise BadRequest(f"content must be a string or a list of parts, got {type(content).__name__}", param=where)
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if not isinstance(part, dict) or kind not in TEXT_PARTS:
            reads = " (this server's model reads text only)" if kind in NON_TEXT_PARTS else ""
            raise BadRequest(
                f"content parts of type {str(kind)[:50]!r} are not supported{reads}: send input_text parts",
                param=f"{where}[{j}].type",
            )
        value = part.get("refusal" if kind == "refusal" else "text", "")
        if not isinstance(value, str):
            raise BadRequest("a text part's text must be a string", param=f"{where}[{j}].text")
        texts.append(value)
    return "".join(texts)


def _string(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise BadRequest(f"a {item.get('type')} item needs a non-empty string {key!r}", param=f"{where}.{key}")
    return value


def input_messages(items: str | list[Any], max_items: int) -> list[dict[str, Any]]:
    """The `input` as chat messages (see the module docstring)."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if len(items) > max_items:
        raise BadRequest(
            f"{len(items)} input items; this server takes at most {max_items} (RequestLimits.max_messages)",
            param="input",
        )
    out: list[dict[str, Any]] = []
    names: dict[str, str] = {}  # call_id -> the function's name (a tool message names it, as templates expect)
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise BadRequest(f"an input item must be an object, got {type(item).__name__}", param=where)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = ROLES.get(str(item.get("role")))
            if role is None:
                raise BadRequest(
                    f"message role {str(item.get('role'))[:50]!r} is not one of {sorted(ROLES)}", param=f"{where}.role"
                )
            out.append({"role": role, "content": _text(item.get("content"), f"{where}.content")})
        elif kind == "function_call":
            call_id, name = _string(item, "call_id", where), _string(item, "name", where)
            args = item.get("arguments", "")
            call = {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)},
            }
            if out and out[-1]["role"] == "assistant":  # a call of the turn the message before it began
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
            names[call_id] = name
        elif kind == "function_call_output":
            call_id = _string(item, "call_id", where)
            msg = {"role": "tool", "tool_call_id": call_id}
            if call_id in names:
                msg["name"] = names[call_id]
            msg["content"] = _text(item.get("output"), f"{where}.output")
            out.append(msg)
        elif kind == "reasoning":  # a placeholder turn the next assistant item joins (`_join_reasoning`)
            text = _reasoning_text(item)
            if text:  # OpenAI's own items may carry only a summary: nothing of the policy's to render
                out.append({"role": "assistant", "content": "", "reasoning_content": text, _ONLY: True})
        elif kind == "item_reference":
            raise BadRequest(
                "item_reference is not supported: this server keeps no items; send the item itself, or continue "
                "a stored response with previous_response_id",
                param=f"{where}.type",
            )
        else:
            raise BadRequest(
                f"input items of type {str(kind)[:50]!r} are not supported: send messages, function_call, "
                "function_call_output and reasoning items",
                param=f"{where}.type",
            )
    return _join_reasoning(out)


_ONLY = "_reasoning_only"  # marks a reasoning item's placeholder turn (never leaves this module)


def _reasoning_text(item: dict[str, Any]) -> str:
    """A reasoning item's text: its `content` reasoning_text parts (OpenAI's own items may carry only a summary)."""
    parts = item.get("content")
    texts = [p.get("text") for p in (parts if isinstance(parts, list) else []) if isinstance(p, dict)]
    return "".join(t for t in texts if isinstance(t, str))


def _join_reasoning(msgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each reasoning placeholder joined to the assistant turn it begins: a following function_call already joined
    it (it continues an assistant message), a following assistant message takes its reasoning_content; one with
    no assistant turn after it is dropped."""
    out: list[dict[str, Any]] = []
    for m in msgs:
        prev = out[-1] if out else None
        if prev is not None and prev.get(_ONLY) and m["role"] == "assistant" and not prev.get("tool_calls"):
            text = prev["reasoning_content"] + (m["reasoning_content"] if m.get(_ONLY) else "")
            out[-1] = {**m, "reasoning_content": text}
            continue
        if prev is not None and prev.get(_ONLY) and not prev.get("tool_calls"):
            out.pop()
        out.append(m)
    if out and out[-1].get(_ONLY) and not out[-1].get("tool_calls"):
        out.pop()
    for m in out:
        m.pop(_ONLY, None)
    return out


def response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    """`text.format` in chat's `response_format` shape: the Responses json_schema format is flat
    (`{"type": "json_schema", "name", "schema", "strict"}`), chat's nests it under `json_schema`."""
    fmt = text.get("format") if isinstance(text, dict) else None
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise BadRequest("text.format must be an object", param="text.format")
    if fmt.get("type") == "json_schema" and "json_schema" not in fmt:
        keep = ("name", "schema", "strict", "description")
        return {"type": "json_schema", "json_schema": {k: fmt[k] for k in keep if k in fmt}}
    return fmt


def chat_request(
    body: ResponsesRequest, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
) -> ChatRequest:
    """The ChatRequest a Responses request asks for, validated as the chat route validates its body (a field out
    of range is the same 422, naming it)."""
    fields: dict[str, Any] = {"messages": messages, "tools": tools, "tool_choice": body.tool_choice}
    if body.max_output_tokens is not None:
        fields["max_tokens"] = body.max_output_tokens
    for key in ("temperature", "top_p", "top_k", "seed"):
        if getattr(body, key) is not None:
            fields[key] = getattr(body, key)
    fields["logprobs"] = "message.output_text.logprobs" in (body.include or [])
    fields["response_format"] = response_format(body.text)
    try:
        return ChatRequest.model_validate(fields)
    except ValidationError as e:
        raise RequestValidationError(e.errors()) from None
