"""An OpenAI-compatible HTTP server for any Sampler (in practice the live policy's HFSampler).

    GET  /v1/models             the one served model
    POST /v1/chat/completions   messages (+ tools) -> chat template -> sampler; the model family's tool calls ->
                                tool_calls, its reasoning -> reasoning_content (the call itself: openai_chat.py;
                                the formats: reply_parsers.py)
    POST /v1/completions        prompt as text, a list of token ids, or a batch of either (vLLM accepts ids too)
    POST /v1/responses          OpenAI's Responses API over the same chat call (openai_responses.py)
    GET  /health

`stream: true` (all three POST routes): server-sent events in OpenAI's formats, cut from the finished answer
(openai_stream.py), recorded exactly as a call that was not streamed. Any other route answers 404 in OpenAI's
error shape, listing the routes served.

Extensions (vLLM's names where vLLM has one): `top_k`; `return_token_ids: true` adds `token_ids` to each
choice and `prompt_token_ids` to the response; `return_tokens_as_token_ids: true` writes logprob tokens as
"token_id:123". Only the sampled token's logprob is returned (`top_logprobs` lists are empty).

Rollout recording: a request with header `X-Rollout-Id: <id>` or body field `rollout_id` (the `openai` client
sends it with `extra_body={"rollout_id": ...}`) is recorded in `app.state.recorder` (a RolloutRecorder) with
the exact prompt ids, completion ids and logprobs; see recorder.py for how calls become a Trajectory. A rollout
with sampling defaults (AgentEnv: the run's) gets them in the fields its requests leave unset
(rollout_defaults.py).

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

Errors are OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`: 400 for a refused request (what
this server cannot do, named with the field and what to use instead), 404 / 405 for an unknown route or method,
422 for a body that does not fit the schema (the message names the fields and never echoes their values), 504 for
a timeout.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Protocol, cast

from fastapi import FastAPI, Request

from posttrain.sampling.base import Sampler
from posttrain.sampling.chat_prompt import ChatRenderer
from posttrain.sampling.openai_chat import chat_completion, envelope, run_chat, sample, token_strs
from posttrain.sampling.openai_prompts import (
    ServerState,
    check_sampling,
    completion_prompts,
    longest_token_chars,
    reject_echo,
    sample_params,
)
from posttrain.sampling.openai_requests import (
    ChatRequest,
    CompletionRequest,
    RequestLimits,
    SamplingRequest,
    add_error_handlers,
)
from posttrain.sampling.openai_responses import create_response
from posttrain.sampling.openai_responses_input import ResponsesRequest
from posttrain.sampling.openai_stream import chat_chunks, chunk_stream, completion_chunks
from posttrain.sampling.recorder import RecordedCall, RolloutRecorder
from posttrain.sampling.reply_parsers import ReplyParsers
from posttrain.sampling.rollout_defaults import with_rollout_defaults
from posttrain.sampling.rollout_paths import RolloutPaths

log = logging.getLogger(__name__)
ROLLOUT_HEADER = "x-rollout-id"


class WeightWritable(Protocol):
    """A sampler whose weights `write(model)` changes in place, between decodes (HFSampler)."""

    @property
    def policy_version(self) -> int: ...

    def update_weights(self, write: Callable[[Any], Any], version: int) -> None: ...

    def set_version(self, version: int) -> None: ...


def create_app(
    sampler: Sampler,
    tokenizer: Any,
    model_name: str = "posttrain",
    recorder: RolloutRecorder | None = None,
    request_timeout_s: float = 300.0,
    default_max_tokens: int = 512,
    weights_dir: str | None = None,
    limits: RequestLimits | None = None,
    tool_parser: str = "auto",
    reasoning_parser: str = "auto",
) -> FastAPI:
    """The FastAPI app. `app.state.posttrain` is the ServerState; `app.state.recorder` the RolloutRecorder.
    `weights_dir`: enables POST /update_weights_from_disk, which loads what a trainer's FileWeights wrote there
    (only from that folder: a request names no path, so the endpoint cannot read arbitrary files). `limits`:
    what one request may ask for (the HTTP-level limits and the API key belong to the server, http_serve).
    `tool_parser` / `reasoning_parser`: how replies are read (reply_parsers.py; auto: the chat template's family)."""
    st = ServerState(
        sampler,
        tokenizer,
        model_name,
        recorder or RolloutRecorder(),
        request_timeout_s,
        default_max_tokens,
        ChatRenderer(tokenizer),
        limits or RequestLimits(),
        longest_token_chars(tokenizer),
        replies=ReplyParsers(tokenizer, tool_parser, reasoning_parser),
    )
    app = FastAPI(title="posttrain OpenAI-compatible server")
    app.add_middleware(RolloutPaths)  # /rollouts/<id>/v1/...: a rollout's own base URL (rollout_paths.py)
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
            sampler.set_version(box["v"])
            return {"success": True, "policy_version": box["v"]}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return list_models(st)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, request: Request) -> Any:
        rid = request.headers.get(ROLLOUT_HEADER)
        return await chat_completions(st, with_rollout_defaults(body, st.recorder, rid or body.rollout_id), rid)

    @app.post("/v1/completions")
    async def completions_route(body: CompletionRequest, request: Request) -> Any:
        rid = request.headers.get(ROLLOUT_HEADER)
        return await completions(st, with_rollout_defaults(body, st.recorder, rid or body.rollout_id), rid)

    @app.post("/v1/responses")
    async def responses_route(body: ResponsesRequest, request: Request) -> Any:
        rid = request.headers.get(ROLLOUT_HEADER)
        return await create_response(st, with_rollout_defaults(body, st.recorder, rid or body.rollout_id), rid)

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
    out = chat_completion(st, body, await run_chat(st, body, header_rid or body.rollout_id))
    if body.stream:
        return chunk_stream(chat_chunks(out, _include_usage(body)))
    return out


async def completions(st: ServerState, body: CompletionRequest, header_rid: str | None) -> Any:
    reject_echo(body.echo)
    check_sampling(st, body)
    rid = header_rid or body.rollout_id
    asked = body.max_tokens if "max_tokens" in body.model_fields_set else None
    prompts_P, max_tokens = await st.off_loop(
        completion_prompts, st, body.prompt, asked or body.max_tokens, asked is not None
    )
    groups = await sample(st, prompts_P, sample_params(body, max_tokens), body.n)
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
                toks = token_strs(st, c.token_ids, body)
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
    out = envelope("text_completion", st, prompts_P, groups, choices)
    if body.stream:
        return chunk_stream(completion_chunks(out, _include_usage(body)))
    return out


def _include_usage(body: SamplingRequest) -> bool:
    return body.stream_options is not None and body.stream_options.include_usage


def build_model_app(
    model: str,
    lora: str | None = None,
    dtype: str = "float32",
    seed: int = 0,
    request_timeout_s: float = 300.0,
    log=print,
    weights_dir: str | None = None,
    limits: RequestLimits | None = None,
    tool_parser: str = "auto",
    reasoning_parser: str = "auto",
) -> FastAPI:
    """`posttrain serve`: load a model (or a LoRA adapter folder on its base) and serve it with an HFSampler."""
    from posttrain.models.load import ensure_pad_token, load_model, stop_token_ids
    from posttrain.sampling.hf_sampler import HFSampler

    net, tok = load_model(lora or model, dtype, seed=seed, log=log)
    ensure_pad_token(tok)
    sampler = HFSampler(net, tok, stop_token_ids(net, tok), seed=seed)
    return create_app(
        sampler,
        tok,
        model_name=model,
        request_timeout_s=request_timeout_s,
        weights_dir=weights_dir,
        limits=limits,
        tool_parser=tool_parser,
        reasoning_parser=reasoning_parser,
    )
