"""What a request to the OpenAI-compatible server may be (sampling/openai_server.py): the request schemas, the
limits checked before any work starts, and the errors in OpenAI's shape, `{"error": {"message", "type", "param",
"code"}}` (400 for a refused request, 404 for an unknown route (the message lists the routes served), 405 for a
route asked with the wrong method, 422 for a body that does not fit the schema, naming the fields without echoing
their values, 504 for a timeout). The Responses API's request is openai_responses_input.py's."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from posttrain.sampling.http_serve import schema_error_message

log = logging.getLogger(__name__)
# 0 means greedy; a positive temperature below this is refused: logits / temperature overflows float32 near 1e-37
# (1e-300 gave NaN logprobs, then a 500 writing them), and nothing useful lies between 0 and 1e-4.
MIN_TEMPERATURE = 1e-4


@dataclass(frozen=True)
class RequestLimits:
    """What one request may ask for (checked before any work starts; each refusal says which limit)."""

    max_messages: int = 1024  # messages in one chat request
    max_chars: int = 1_000_000  # characters of text in one request: messages, tools, text prompts
    max_n: int = 64  # completions per prompt (a GRPO group of up to 64 in one request)
    max_prompts: int = 64  # prompts in one /v1/completions call (OpenAISampler sends at most 64)
    max_stop: int = 16  # stop strings
    max_stop_chars: int = 1000  # their characters, together
    max_temperature: float = 2.0  # OpenAI's range is [0, 2]

    def __post_init__(self):
        for name in ("max_messages", "max_chars", "max_n", "max_prompts", "max_stop", "max_stop_chars"):
            if getattr(self, name) < 1:
                raise ValueError(f"RequestLimits.{name} must be >= 1, got {getattr(self, name)}")
        if not MIN_TEMPERATURE <= self.max_temperature < math.inf:
            raise ValueError(f"RequestLimits.max_temperature must be finite and >= {MIN_TEMPERATURE}")


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool = False  # a last chunk with the usage and no choices


class SamplingRequest(BaseModel):
    """The sampling fields every generating request shares (chat, completions; openai_prompts.py reads them)."""

    # Unknown OpenAI fields (user, presence_penalty, ...) are ignored; NaN and infinities are schema errors.
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)
    model: str | None = None
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0, lt=2**31)
    n: int = Field(1, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=-(2**63), lt=2**64)  # what torch.Generator.manual_seed takes
    stream: bool = False
    stream_options: StreamOptions | None = None
    rollout_id: str | None = None
    return_token_ids: bool = False
    return_tokens_as_token_ids: bool = False


class ChatRequest(SamplingRequest):
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    # "none": replies are not parsed for calls; "required" / a named function: the call's opening is forced and the
    # rest held to its schema (openai_chat.py `output_plan`); "auto" / None: the policy decides.
    tool_choice: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None  # text, json_object or json_schema (sampling/constrained.py)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)


class CompletionRequest(SamplingRequest):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int = Field(16, ge=1)
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False


class BadRequest(ValueError):
    """A request this server refuses: 400 with `code` (OpenAI's string code when there is one) and `param`, the
    request field at fault (`tools[0].type`), when there is one."""

    def __init__(self, message: str, code: str | int = 400, param: str | None = None):
        super().__init__(message)
        self.code = code
        self.param = param


class ContextLengthExceeded(BadRequest):
    def __init__(self, message: str):
        super().__init__(message, "context_length_exceeded")


class HTTPError(Exception):
    """An answer other than a refusal (504: the sampler timed out)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def _error(
    status: int,
    message: str,
    kind: str,
    code: str | int | None = None,
    param: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    err = {"message": message, "type": kind, "param": param, "code": status if code is None else code}
    return JSONResponse(status_code=status, content={"error": err}, headers=headers)


def served_routes(app: Any) -> list[str]:
    """The app's API routes as "METHOD /path", sorted by path (FastAPI's own /docs and /openapi.json left out)."""
    routes = [r for r in app.routes if isinstance(r, APIRoute)]
    return [f"{m} {r.path}" for r in sorted(routes, key=lambda r: r.path) for m in sorted(r.methods)]


def _route_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
    """An unknown route (404) or method (405) in OpenAI's shape, naming the routes served: FastAPI's bare
    `{"detail": "Not Found"}` reads as "model not found" to clients that expect OpenAI's errors."""
    asked = f"{request.method} {request.url.path}"
    served = served_routes(request.app)
    if e.status_code == 404:
        message = f"Unknown route: {asked}. This server serves: {', '.join(served)}"
        return _error(404, message, "invalid_request_error", "unknown_url")
    if e.status_code == 405:
        same = [r for r in served if r.split(" ", 1)[1] == request.url.path]
        message = f"{asked} is not allowed; this route takes {', '.join(same) or 'another method'}"
        return _error(405, message, "invalid_request_error", "method_not_allowed", headers=e.headers)
    return _error(e.status_code, str(e.detail), "invalid_request_error", headers=e.headers)


def add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(BadRequest)
    async def _bad_request(_: Request, e: BadRequest) -> JSONResponse:
        return _error(400, str(e), "invalid_request_error", e.code, e.param)

    @app.exception_handler(StarletteHTTPException)
    async def _route(request: Request, e: StarletteHTTPException) -> JSONResponse:
        return _route_error(request, e)

    @app.exception_handler(RequestValidationError)
    async def _schema(_: Request, e: RequestValidationError) -> JSONResponse:
        message, param = schema_error_message(e)
        return _error(422, message, "invalid_request_error", param=param)

    @app.exception_handler(HTTPError)
    async def _http_error(_: Request, e: HTTPError) -> JSONResponse:
        return _error(e.status, str(e), "timeout" if e.status == 504 else "server_error")

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, e: Exception) -> JSONResponse:  # a bug: answer 500, keep serving
        log.exception("unhandled error in request")
        return _error(500, f"{type(e).__name__}: {e}", "server_error")
