"""An OpenAI-compatible HTTP server for any Sampler (in practice the live policy's HFSampler).

    GET  /v1/models             the one served model
    POST /v1/chat/completions   messages (+ tools) -> chat template -> sampler; `<tool_call>` blocks -> tool_calls
    POST /v1/completions        prompt as text, a list of token ids, or a batch of either (vLLM accepts ids too)
    GET  /health

Extensions (vLLM's names where vLLM has one): `top_k`; `return_token_ids: true` adds `token_ids` to each
choice and `prompt_token_ids` to the response; `return_tokens_as_token_ids: true` writes logprob tokens as
"token_id:123". Only the sampled token's logprob is returned (`top_logprobs` lists are empty).

Rollout recording: a request with header `X-Rollout-Id: <id>` or body field `rollout_id` (the `openai` client
sends it with `extra_body={"rollout_id": ...}`) is recorded in `app.state.recorder` (a RolloutRecorder) with
the exact prompt ids, completion ids and logprobs; see recorder.py for how calls become a Trajectory.

Every sampler call has a timeout (`request_timeout_s`): a timeout answers 504 and is counted in
`app.state.stats["timeouts"]` and logged. The sampler keeps working on a timed-out batch in its thread (Python
cannot stop it), but no caller waits for it.

Limits, checked before any work starts (`RequestLimits`; the HTTP ones, body size, header and body timeouts and
the API key, are http_serve.HttpGuard's): message count and the request's characters, `n`, prompts per
/v1/completions call, the stop list, temperature (0, or 1e-4 to `max_temperature`) and top_p (in (0, 1]) finite,
and each prompt + max_tokens within the sampler's context (`sampler.context`, sampling/context.py): past it the
answer is 400 with code `context_length_exceeded`, as OpenAI's, or under `context.overflow == "truncate"`
max_tokens cut to fit. A request that sets no max_tokens gets the server's default, cut to what the prompt leaves.
Whether a prompt fits is known without tokenizing it when its text is longer than the context times the
tokenizer's longest token. Rendering the chat template and tokenizing run in worker threads (two), never on the
event loop, so /health keeps answering while a long prompt is prepared.

Errors are OpenAI's shape, `{"error": {"message", "type", "code"}}`: 400 for a refused request, 422 for a body
that does not fit the schema (the message names the fields and never echoes their values), 504 for a timeout.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any, Protocol, cast

from fastapi import FastAPI, Request

from posttrain.sampling.base import Sampler
from posttrain.sampling.chat_prompt import ChatRenderer
from posttrain.sampling.context import ContextOverflow
from posttrain.sampling.openai_prompts import (
    ServerState,
    _chat_prompt,
    _check_sampling,
    _completion_prompts,
    _max_token_chars,
    _params,
    _reject_unsupported,
)
from posttrain.sampling.openai_requests import (
    BadRequest,
    ChatRequest,
    CompletionRequest,
    ContextLengthExceeded,
    HTTPError,
    RequestLimits,
    _Sampling,
    add_error_handlers,
)
from posttrain.sampling.recorder import RecordedCall, RolloutRecorder
from posttrain.sampling.tool_calls import parse_tool_calls
from posttrain.types import Completion, SampleParams

log = logging.getLogger(__name__)
ROLLOUT_HEADER = "x-rollout-id"


class WeightWritable(Protocol):
    """A sampler whose weights `write(model)` changes in place, between decodes (HFSampler)."""

    policy_version: int

    def update_weights(self, write: Callable[[Any], Any], version: int) -> None: ...


def create_app(
    sampler: Sampler,
    tokenizer: Any,
    model_name: str = "posttrain",
    recorder: RolloutRecorder | None = None,
    request_timeout_s: float = 300.0,
    default_max_tokens: int = 512,
    weights_dir: str | None = None,
    limits: RequestLimits | None = None,
) -> FastAPI:
    """The FastAPI app. `app.state.posttrain` is the ServerState; `app.state.recorder` the RolloutRecorder.
    `weights_dir`: enables POST /update_weights_from_disk, which loads what a trainer's FileWeights wrote there
    (only from that folder: a request names no path, so the endpoint cannot read arbitrary files). `limits`:
    what one request may ask for (the HTTP-level limits and the API key belong to the server, http_serve)."""
    st = ServerState(
        sampler,
        tokenizer,
        model_name,
        recorder or RolloutRecorder(),
        request_timeout_s,
        default_max_tokens,
        ChatRenderer(tokenizer),
        limits or RequestLimits(),
        _max_token_chars(tokenizer),
    )
    app = FastAPI(title="posttrain OpenAI-compatible server")
    app.state.posttrain = st
    app.state.recorder = st.recorder
    add_error_handlers(app)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "policy_version": st.sampler.policy_version, **st.stats}

    if weights_dir is not None:

        @app.post("/update_weights_from_disk")
        async def update_weights() -> dict[str, Any]:
            from posttrain.sampling.weight_ipc import read_file_weights

            box: dict[str, int] = {}
            sampler = cast(WeightWritable, st.sampler)  # weights_dir is served with an HFSampler (build_model_app)
            # Between decodes (the sampler's lock), so no completion mixes two versions.
            await asyncio.to_thread(
                sampler.update_weights, lambda m: box.setdefault("v", read_file_weights(weights_dir, m)), -1
            )
            sampler.policy_version = box["v"]
            return {"success": True, "policy_version": box["v"]}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return list_models(st)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, request: Request) -> Any:
        return await chat_completions(st, body, request.headers.get(ROLLOUT_HEADER))

    @app.post("/v1/completions")
    async def completions_route(body: CompletionRequest, request: Request) -> Any:
        return await completions(st, body, request.headers.get(ROLLOUT_HEADER))

    return app


# ---- routes ------------------------------------------------------------------------------------------------
def list_models(st: ServerState) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [
            {
                "id": st.model_name,
                "object": "model",
                "created": 0,
                "owned_by": "posttrain",
                "policy_version": st.sampler.policy_version,
            }
        ],
    }


async def chat_completions(st: ServerState, body: ChatRequest, header_rid: str | None) -> Any:
    _reject_unsupported(body.stream, False)
    _check_sampling(st, body)
    if len(body.messages) > st.limits.max_messages:
        raise BadRequest(
            f"{len(body.messages)} messages; this server takes at most {st.limits.max_messages} "
            "(RequestLimits.max_messages)"
        )
    if body.tools is not None and len(body.tools) > st.limits.max_messages:
        raise BadRequest(
            f"{len(body.tools)} tools; this server takes at most {st.limits.max_messages} (RequestLimits.max_messages)"
        )
    rid = header_rid or body.rollout_id
    prev = st.recorder.last(rid) if rid else None
    asked = body.max_completion_tokens or body.max_tokens
    prompt_ids, max_tokens = await st.off_loop(_chat_prompt, st, body, prev, asked)
    (comps,) = await _sample(st, [prompt_ids], _params(body, max_tokens), body.n)
    choices = []
    for i, c in enumerate(comps):
        content, calls, _errors = parse_tool_calls(c.text) if body.tools else (c.text, [], [])
        message: dict[str, Any] = {"role": "assistant", "content": content}
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
        choice: dict[str, Any] = {"index": i, "message": message, "finish_reason": finish, "logprobs": None}
        if body.logprobs:
            choice["logprobs"] = {
                "content": [
                    {"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
                    for t, lp in zip(_token_strs(st, c.token_ids, body), c.logprobs)
                ]
            }
        if body.return_token_ids:
            choice["token_ids"] = c.token_ids
        choices.append(choice)
        if rid:
            st.recorder.record(
                rid,
                RecordedCall(
                    prompt_ids,
                    c.token_ids,
                    c.logprobs,
                    c.policy_version,
                    c.finish_reason,
                    text=c.text,
                    messages=body.messages,
                    tools=body.tools,
                    reply=message,
                    token_versions=c.token_versions,
                ),
            )
    out = _envelope("chat.completion", st, [prompt_ids], [comps], choices)
    if body.return_token_ids:
        out["prompt_token_ids"] = prompt_ids
    return out


async def completions(st: ServerState, body: CompletionRequest, header_rid: str | None) -> Any:
    _reject_unsupported(body.stream, body.echo)
    _check_sampling(st, body)
    rid = header_rid or body.rollout_id
    asked = body.max_tokens if "max_tokens" in body.model_fields_set else None
    prompts_P, max_tokens = await st.off_loop(
        _completion_prompts, st, body.prompt, asked or body.max_tokens, asked is not None
    )
    groups = await _sample(st, prompts_P, _params(body, max_tokens), body.n)
    choices = []
    for p, (prompt_ids, comps) in enumerate(zip(prompts_P, groups)):
        for j, c in enumerate(comps):
            choice: dict[str, Any] = {
                "index": p * body.n + j,
                "text": c.text,
                "finish_reason": c.finish_reason,
                "logprobs": None,
            }
            if body.logprobs is not None:
                toks = _token_strs(st, c.token_ids, body)
                offsets, pos = [], 0
                for t in toks:
                    offsets.append(pos)
                    pos += len(t)
                choice["logprobs"] = {
                    "tokens": toks,
                    "token_logprobs": c.logprobs,
                    "top_logprobs": [{} for _ in toks] if body.logprobs else None,
                    "text_offset": offsets,
                }
            if body.return_token_ids:
                choice["token_ids"] = c.token_ids
                choice["prompt_token_ids"] = prompt_ids
            choices.append(choice)
            if rid:
                st.recorder.record(
                    rid,
                    RecordedCall(
                        prompt_ids,
                        c.token_ids,
                        c.logprobs,
                        c.policy_version,
                        c.finish_reason,
                        text=c.text,
                        token_versions=c.token_versions,
                    ),
                )
    return _envelope("text_completion", st, prompts_P, groups, choices)


# ---- helpers -----------------------------------------------------------------------------------------------
async def _sample(st: ServerState, prompts_P: list[list[int]], params: SampleParams, n: int) -> list[list[Completion]]:
    st.stats["requests"] += 1
    try:
        return await asyncio.wait_for(st.sampler.sample(prompts_P, params, n=n), st.request_timeout_s)
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


def _token_strs(st: ServerState, ids: list[int], body: _Sampling) -> list[str]:
    if body.return_tokens_as_token_ids:
        return [f"token_id:{i}" for i in ids]
    return [st.tokenizer.decode([i]) for i in ids]


def _envelope(
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


def build_model_app(
    model: str,
    lora: str | None = None,
    dtype: str = "float32",
    seed: int = 0,
    request_timeout_s: float = 300.0,
    log=print,
    weights_dir: str | None = None,
    limits: RequestLimits | None = None,
) -> FastAPI:
    """`posttrain serve`: load a model (or a LoRA adapter folder on its base) and serve it with an HFSampler."""
    from posttrain.models.load import ensure_pad_token, load_model, stop_token_ids
    from posttrain.sampling.hf_sampler import HFSampler

    net, tok = load_model(lora or model, dtype, seed=seed, log=log)
    ensure_pad_token(tok)
    sampler = HFSampler(net, tok, stop_token_ids(net, tok), seed=seed)
    return create_app(
        sampler, tok, model_name=model, request_timeout_s=request_timeout_s, weights_dir=weights_dir, limits=limits
    )
