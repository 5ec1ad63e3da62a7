"""What a request to the OpenAI-compatible server may be (sampling/openai_server.py): the request schemas, the
limits checked before any work starts, and the errors in OpenAI's shape, `{"error": {"message", "type", "code"}}`
(400 for a refused request, 422 for a body that does not fit the schema, naming the fields without echoing their
values, 504 for a timeout)."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

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


class _Sampling(BaseModel):
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
    rollout_id: str | None = None
    return_token_ids: bool = False
    return_tokens_as_token_ids: bool = False


class ChatRequest(_Sampling):
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)


class CompletionRequest(_Sampling):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int = Field(16, ge=1)
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False


class BadRequest(ValueError):
    """A request this server refuses: 400 with `code` (OpenAI's string code when there is one)."""

    def __init__(self, message: str, code: str | int = 400):
        super().__init__(message)
        self.code = code


class ContextLengthExceeded(BadRequest):
    def __init__(self, message: str):
        super().__init__(message, "context_length_exceeded")


class HTTPError(Exception):
    """An answer other than a refusal (504: the sampler timed out)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def _error(
    status: int, message: str, kind: str, code: str | int | None = None, param: str | None = None
) -> JSONResponse:
    err: dict[str, Any] = {"message": message, "type": kind, "code": status if code is None else code}
    if param is not None:
        err["param"] = param
    return JSONResponse(status_code=status, content={"error": err})


def add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(BadRequest)
    async def _bad_request(_: Request, e: BadRequest) -> JSONResponse:
        return _error(400, str(e), "invalid_request_error", e.code)

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
