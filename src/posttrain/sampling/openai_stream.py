"""Server-sent events for the OpenAI-compatible server: `stream: true` on /v1/chat/completions and /v1/completions
(OpenAI's chunk format) and the SSE framing /v1/responses' events use (openai_responses.py).

The chunks are cut from the finished answer, the same object a non-streamed call returns: the sampler gives whole
completions (the Sampler protocol has no token-by-token interface, and the HF sampler decodes a batch of callers
together), so the answer is sampled, checked, parsed for tool calls and recorded first, then sent as chunks. So
every error (a refused request, the context, the sampler's timeout) still answers with its own status before the
stream starts, and a streamed call is recorded exactly as a non-streamed one; what a client loses is only the
time to the first token, which is the whole generation's.

Chat chunks (`chat.completion.chunk`), per choice: a first delta `{"role": "assistant", "content": ""}` (with the
choice's `logprobs` when asked), the content in pieces, then each tool call: `{"index", "id", "type", "function":
{"name", "arguments": ""}}` and its arguments in pieces; the last chunk of the choice carries its
`finish_reason` (and the vLLM `token_ids` extension). `stream_options.include_usage`: every chunk has
`"usage": null` and a last chunk has the usage and no choices. Then `data: [DONE]`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import Any

from fastapi.responses import StreamingResponse

PIECE_CHARS = 32  # characters of text (or tool-call arguments) in one delta


def pieces(text: str, size: int = PIECE_CHARS) -> list[str]:
    """`text` in consecutive pieces of at most `size` characters; none for an empty text."""
    return [text[i : i + size] for i in range(0, len(text), size)]


def sse(data: dict[str, Any] | str, event: str | None = None) -> bytes:
    """One server-sent event: `event: <name>` (the Responses API names each), then `data: <json>`."""
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()


def sse_response(frames: Iterable[bytes]) -> StreamingResponse:
    async def body() -> AsyncIterator[bytes]:  # async: no worker thread for frames that are all made already
        for frame in frames:
            yield frame

    return StreamingResponse(
        body(), media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    )


def _base(out: dict[str, Any], obj: str, include_usage: bool) -> dict[str, Any]:
    base: dict[str, Any] = {
        "id": out["id"],
        "object": obj,
        "created": out["created"],
        "model": out["model"],
        "system_fingerprint": None,
        "policy_version": out["policy_version"],
    }
    if include_usage:
        base["usage"] = None
    return base


def _chat_deltas(message: dict[str, Any]) -> list[dict[str, Any]]:
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
    deltas += [{"reasoning_content": p} for p in pieces(message.get("reasoning_content") or "")]
    deltas += [{"content": p} for p in pieces(message.get("content") or "")]
    for i, call in enumerate(message.get("tool_calls") or []):
        fn = call["function"]
        deltas.append(
            {"tool_calls": [{"index": i, "id": call["id"], "type": "function", "function": {**fn, "arguments": ""}}]}
        )
        deltas += [{"tool_calls": [{"index": i, "function": {"arguments": p}}]} for p in pieces(fn["arguments"])]
    return deltas


def chat_chunks(out: dict[str, Any], include_usage: bool) -> Iterator[dict[str, Any]]:
    """The `chat.completion.chunk` objects of a finished `chat.completion` object `out`; the first one carries the
    prompt's token ids (the vLLM extension) when `out` has them."""
    deltas = lambda ch: _chat_deltas(ch["message"])
    chunks = _choice_chunks(out, "chat.completion.chunk", include_usage, "delta", deltas, ("token_ids",))
    for n, chunk in enumerate(chunks):
        if n == 0 and chunk["choices"] and "prompt_token_ids" in out:
            chunk["prompt_token_ids"] = out["prompt_token_ids"]
        yield chunk


def completion_chunks(out: dict[str, Any], include_usage: bool) -> Iterator[dict[str, Any]]:
    """The chunks (`text_completion` objects) of a finished /v1/completions answer `out`: each choice's text in
    pieces."""
    texts = lambda ch: pieces(ch["text"]) or [""]
    yield from _choice_chunks(out, "text_completion", include_usage, "text", texts, ("token_ids", "prompt_token_ids"))


def _choice_chunks(
    out: dict[str, Any],
    obj: str,
    include_usage: bool,
    key: str,
    parts: Callable[[dict[str, Any]], list[Any]],
    extensions: tuple[str, ...],
) -> Iterator[dict[str, Any]]:
    """One chunk per part of each choice (`parts(choice)`, sent under `key`): its logprobs on the first, its
    finish_reason and the choice's `extensions` (token-id keys) it has on the last; the usage chunk last when
    asked."""
    base = _base(out, obj, include_usage)
    for choice in out["choices"]:
        bodies = parts(choice)
        for k, body in enumerate(bodies):
            last = k == len(bodies) - 1
            c: dict[str, Any] = {
                "index": choice["index"],
                key: body,
                "logprobs": choice["logprobs"] if k == 0 else None,
                "finish_reason": choice["finish_reason"] if last else None,
            }
            if last:
                c.update({x: choice[x] for x in extensions if x in choice})
            yield {**base, "choices": [c]}
    if include_usage:
        yield {**base, "choices": [], "usage": out["usage"]}


def chunk_stream(chunks: Iterable[dict[str, Any]]) -> StreamingResponse:
    """Chunks as `data: {...}` events, then `data: [DONE]`."""
    return sse_response([*(sse(c) for c in chunks), sse("[DONE]")])
