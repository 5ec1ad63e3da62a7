"""A rollout's own base URL: `<server>/rollouts/<id>/v1`, so an agent framework that builds its own client from a
base URL (ChatOpenAI, pydantic-ai's provider, smolagents, litellm) is recorded under its episode with nothing but
`base_url` changed: no header to thread through.

`RolloutPaths` (an ASGI wrapper) turns `/rollouts/<id>/<rest>` into `/<rest>` with `X-Rollout-Id: <id>` (replacing
one the client may also send: the path is what AgentEnv handed out). An id is percent-encoded in the path (a
verifiers seat's id holds a `/`), at most `MAX_ID_CHARS` characters of printable ASCII (it becomes a header
value); anything else is answered 404 in OpenAI's error shape before the app sees it.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, unquote

from starlette.responses import JSONResponse

PREFIX = "/rollouts/"
HEADER = b"x-rollout-id"
MAX_ID_CHARS = 256


def rollout_base_url(server_url: str, rollout_id: str) -> str:
    """The OpenAI base URL (ending in /v1) whose every request is recorded under `rollout_id`. An id the server
    would refuse, or a dot segment ("." and ".." are removed from a path by HTTP clients), is a ValueError here."""
    if rollout_id in (".", "..") or _rollout_id(quote(rollout_id, safe="")) is None:
        raise ValueError(f"not a rollout id for a URL path: {rollout_id[:80]!r}")
    return f"{server_url.rstrip('/')}{PREFIX}{quote(rollout_id, safe='')}/v1"


def _rollout_id(segment: str) -> str | None:
    rid = unquote(segment)
    if not rid or len(rid) > MAX_ID_CHARS or not (rid.isascii() and rid.isprintable()):  # an HTTP header value
        return None
    return rid


class RolloutPaths:
    """Wraps an ASGI app: requests under `/rollouts/<id>/` reach it as the same request with the rollout header."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if not path.startswith(PREFIX):
            await self.app(scope, receive, send)
            return
        # the raw (still percent-encoded) path: an encoded "/" inside the id must not split it
        raw = scope.get("raw_path", path.encode()).decode("latin-1").split("?", 1)[0]
        segment, sep, rest = raw[len(PREFIX) :].partition("/")
        rid = _rollout_id(segment) if sep else None
        if rid is None:
            msg = f"no such rollout path {path[:80]!r}: use {PREFIX}<id>/v1/..."
            body = {"error": {"message": msg, "type": "invalid_request_error", "code": "not_found"}, "detail": msg}
            await JSONResponse(body, status_code=404)(scope, receive, send)
            return
        tail = "/" + rest
        headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() != HEADER]
        headers.append((HEADER, rid.encode()))
        inner = {**scope, "path": unquote(tail), "raw_path": tail.encode("latin-1"), "headers": headers}
        await self.app(inner, receive, send)
