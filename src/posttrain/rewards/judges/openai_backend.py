"""A judge backend on any OpenAI-compatible chat endpoint (`posttrain serve`, vLLM, SGLang, a hosted API), through
the `openai` client (the `judge` extra: pip install 'posttrain[judge]').

Yes/no questions ask for one token at temperature 0 with `logprobs` and `top_logprobs`; P(Yes) is read from the
top alternatives (summed over "yes"/"no" spellings) when the server returns them. A server that returns none
(`posttrain serve` returns only the sampled token's logprob) gives a hard verdict from the answer text: 1.0 for
"Yes", 0.0 for "No", anything else is malformed output.

Each prompt is its own request (the chat API has no batch of conversations); a batch is sent concurrently,
`max_concurrency` at a time. The client's own retries are off (`max_retries=0`): the runner retries, bounded, so
one policy holds for every backend. Every request has the client timeout `timeout_s`.

Every reply is hostile input until checked (`_ReplyBound`, `_reply_json`, `_at`): its body is read through a size
cap (`max_reply_bytes`: the Content-Length header, else the bytes as they arrive, before the client buffers
anything) and a time cap (`timeout_s` for the whole body, on top of the client's per-read timeout, which a server
sending a byte at a time never trips), uncompressed (a gzip body could decode to any size), then parsed as strict
JSON (bounded.py: no NaN or Infinity, nesting capped) and checked field by field. Whatever is wrong with one reply
(the connection, its size, its JSON, its shape, an error body under HTTP 200, a log-prob that is not a finite
number <= 0) fails only that prompt, with a reason that names it.
"""

from __future__ import annotations

import importlib
import math
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from posttrain.bounded import BoundedError, loads_json
from posttrain.errors import MissingExtraError
from posttrain.rewards.judges.backends import is_no_token, is_yes_token
from posttrain.rewards.judges.errors import (
    JudgeBadOutput,
    JudgeError,
    JudgeRequestError,
    JudgeTimeout,
    JudgeUnavailable,
)
from posttrain.rewards.judges.verdicts import parse_label

MAX_MODEL_NAME = 256  # a served model's name goes into cache keys and log lines
LOGPROB_SLACK = 1e-4  # servers round; a log-prob above this is a probability over 1


class OpenAIBackend:
    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 30.0,
        max_concurrency: int = 8,
        top_logprobs: int = 10,
        http_client: Any = None,
        max_reply_bytes: int = 1 << 20,
    ):
        """`base_url`: the server root or its /v1. `model`: the served model's name (default: the first of
        /v1/models, asked once). `api_key`: default $OPENAI_API_KEY, else a placeholder (local servers ignore
        it). `http_client`: an httpx.Client to use (tests pass one with a mock transport); the reply bounds are
        added to its event hooks. `max_reply_bytes`: the largest reply body read (a chat completion with
        top_logprobs is a few kB)."""
        if timeout_s <= 0 or max_reply_bytes < 1024:
            raise ValueError(f"need timeout_s > 0 and max_reply_bytes >= 1024, got {timeout_s}, {max_reply_bytes}")
        root = base_url.rstrip("/")
        self.base_url = root if root.endswith("/v1") else root + "/v1"
        self.model = model
        self.api_key = api_key or os.environ.get("OPENAI_API_KEY") or "x"
        self.timeout_s, self.max_concurrency, self.top_logprobs = timeout_s, max_concurrency, top_logprobs
        self.max_reply_bytes = max_reply_bytes
        self._http_client = http_client
        self._client: Any = None

    @property
    def judge_id(self) -> str:
        """Names the served model, so a cache never mixes two judges behind one URL. Resolving it asks /v1/models
        once; an endpoint that cannot answer gives '?' (its calls fail, and failures are never cached)."""
        if self.model is None:
            try:
                self._model_name()
            except Exception:  # noqa: BLE001 - the id must not raise: the calls that follow fail with the reason
                return f"openai:{self.base_url}:?"
        return f"openai:{self.base_url}:{self.model}"

    def _openai(self) -> Any:
        if self._client is None:
            try:
                import openai
            except ImportError as e:  # pragma: no cover - depends on the install
                raise MissingExtraError(
                    "the OpenAI judge backend needs the 'judge' extra: pip install 'posttrain[judge]'"
                ) from e
            http = self._http_client if self._http_client is not None else openai.DefaultHttpxClient()
            bound_replies(http, self.max_reply_bytes, self.timeout_s)
            self._client = openai.OpenAI(
                base_url=self.base_url, api_key=self.api_key, timeout=self.timeout_s, max_retries=0, http_client=http
            )
        return self._client

    def _model_name(self) -> str:
        if self.model is None:
            where = f"{self.base_url}/models"
            raw = self._wrap(lambda: self._openai().models.with_raw_response.list(), "models")
            body = _reply_json(raw.http_response.content, where, self.max_reply_bytes)
            if _at(body, "data", where=where) == []:
                raise JudgeRequestError(f"{where} lists no model; pass model=...")
            name = _at(body, "data", 0, "id", where=where)
            if not isinstance(name, str) or not 0 < len(name) <= MAX_MODEL_NAME:
                raise JudgeBadOutput(
                    f"{where}: reply.data[0].id is {_show(name)}, expected a model name "
                    f"(text of 1..{MAX_MODEL_NAME} characters)"
                )
            self.model = name
        return self.model

    def _wrap(self, fn, what: str):
        """Call the client, mapping its exceptions onto the judge's error kinds."""
        import openai

        where = f"{self.base_url}/{what}"
        try:
            return fn()
        except JudgeError:
            raise  # a reply bound (bound_replies), already named
        except openai.APITimeoutError as e:
            raise JudgeTimeout(f"{where}: no answer within {self.timeout_s:g}s") from e
        except openai.APIConnectionError as e:
            if isinstance(e.__cause__, JudgeError):  # a reply bound, through a client version that wraps it
                raise e.__cause__ from None
            raise JudgeUnavailable(f"{where}: cannot connect, or the connection broke ({e.__cause__ or e})") from e
        except openai.APIStatusError as e:
            msg = f"{where}: HTTP {e.status_code}: {str(e.message)[:300]}"
            if e.status_code in (408, 429) or e.status_code >= 500:
                raise JudgeUnavailable(msg) from e
            raise JudgeRequestError(msg) from e
        except openai.OpenAIError as e:  # a reply the client itself could not read
            raise JudgeBadOutput(f"{where}: {type(e).__name__}: {str(e)[:300]}") from e

    def _chat(self, prompt: str, **params: Any) -> dict:
        """One chat completion at temperature 0: the reply's JSON object, read within the bounds."""
        raw = self._wrap(
            lambda: self._openai().chat.completions.with_raw_response.create(
                model=self.model, messages=[{"role": "user", "content": prompt}], temperature=0.0, **params
            ),
            "chat/completions",
        )
        return _reply_json(raw.http_response.content, f"{self.base_url}/chat/completions", self.max_reply_bytes)

    def _each(self, prompts: list[str], one) -> list[Any]:
        self._openai()  # built (and its http client bounded) before the fan-out, not by two threads at once
        self._model_name()  # once, before the fan-out, so a dead endpoint fails the whole call at once
        if len(prompts) == 1:
            return [_catch(one, prompts[0])]
        with ThreadPoolExecutor(max_workers=max(1, min(self.max_concurrency, len(prompts)))) as pool:
            return list(pool.map(lambda p: _catch(one, p), prompts))

    def yes_prob(self, prompts: list[str]) -> list[float | Exception]:
        def one(prompt: str) -> float:
            body = self._chat(prompt, max_tokens=1, logprobs=True, top_logprobs=self.top_logprobs)
            return _yes_prob_from_reply(body)

        return self._each(prompts, one)

    def generate(self, prompts: list[str], max_tokens: int) -> list[str | Exception]:
        return self._each(prompts, lambda p: _content(self._chat(p, max_tokens=max_tokens)))


def _catch(fn, arg):
    """One prompt's answer, or its failure: whatever goes wrong with one reply fails that prompt, not its batch."""
    try:
        return fn(arg)
    except JudgeError as e:
        return e
    except Exception as e:  # noqa: BLE001 - an unforeseen failure on one reply (a bug or an odd reply) stays there
        return JudgeError(f"unexpected {type(e).__name__} on a judge reply: {str(e)[:300]}")


# ------------------------------------------------------------------------------------------ reading a reply


def _show(v: Any) -> str:
    """A JSON value for an error message: its type and the start of its text."""
    return f"{type(v).__name__} {repr(v)[:60]}"


def _reply_json(content: bytes, where: str, max_chars: int) -> dict:
    """The reply body as a JSON object. Strict: UTF-8, JSON without NaN / Infinity, nesting capped, an object, and
    no error object (some servers and proxies answer a failure with HTTP 200)."""
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError as e:
        raise JudgeBadOutput(f"{where}: the reply is not UTF-8 text ({e.reason} at byte {e.start})") from None
    try:
        body = loads_json(text, max_chars=max_chars)
    except BoundedError as e:
        raise JudgeBadOutput(f"{where}: the reply is not valid JSON ({e.reason}): {text[:80]!r}") from None
    if not isinstance(body, dict):
        raise JudgeBadOutput(f"{where}: the reply is a {type(body).__name__}, expected a JSON object")
    if body.get("error") is not None:
        err = body["error"]
        msg = err.get("message") if isinstance(err, dict) else err
        raise JudgeBadOutput(f"{where}: HTTP 200 with an error body: {str(msg)[:300]}")
    return body


def _at(value: Any, *path: str | int, at: str = "reply", where: str = "", optional: bool = False) -> Any:
    """The value at `path` in a JSON reply (`at` names `value` in messages, `where` the endpoint). A missing or null
    step raises JudgeBadOutput naming the path (or gives None when `optional`); a step into the wrong kind of value
    always raises."""
    prefix = f"{where}: " if where else ""
    for key in path:
        if isinstance(key, int):
            if not isinstance(value, list):
                raise JudgeBadOutput(f"{prefix}{at} is {_show(value)}, expected a list")
            present = key < len(value)
            step = value[key] if present else None
            at += f"[{key}]"
        else:
            if not isinstance(value, dict):
                raise JudgeBadOutput(f"{prefix}{at} is {_show(value)}, expected an object")
            step = value.get(key)
            present = step is not None
            at += f".{key}"
        if not present:
            if optional:
                return None
            raise JudgeBadOutput(f"{prefix}{at} is missing")
        value = step
    return value


def _content(body: dict) -> str:
    content = _at(body, "choices", 0, "message", "content")
    if not isinstance(content, str):
        raise JudgeBadOutput(f"reply.choices[0].message.content is {_show(content)}, expected text")
    return content


def _prob(logprob: Any, at: str) -> float:
    """exp(logprob), for a log-prob that is a finite number <= 0 (within rounding)."""
    if isinstance(logprob, bool) or not isinstance(logprob, (int, float)):
        raise JudgeBadOutput(f"{at}.logprob is {_show(logprob)}, expected a number")
    try:
        v = float(logprob)
    except OverflowError:
        v = math.inf
    if not (math.isfinite(v) and v <= LOGPROB_SLACK):
        raise JudgeBadOutput(f"{at}.logprob {logprob!r} is not a finite log-probability (<= 0)")
    return math.exp(min(v, 0.0))


def _yes_prob_from_reply(body: dict) -> float:
    """P(Yes) / (P(Yes) + P(No)) over the first answer token's top alternatives; without them, the answer's text
    must be exactly Yes or No."""
    tops = _at(body, "choices", 0, "logprobs", "content", 0, "top_logprobs", optional=True) or []
    if not isinstance(tops, list):
        raise JudgeBadOutput(f"reply.choices[0].logprobs.content[0].top_logprobs is {_show(tops)}, expected a list")
    p_yes = p_no = 0.0
    for i, top in enumerate(tops):
        at = f"reply.choices[0].logprobs.content[0].top_logprobs[{i}]"
        token, p = _at(top, "token", at=at), _prob(_at(top, "logprob", at=at), at)
        if not isinstance(token, str):
            raise JudgeBadOutput(f"{at}.token is {_show(token)}, expected text")
        p_yes += p if is_yes_token(token) else 0.0
        p_no += p if is_no_token(token) else 0.0
    if p_yes + p_no > 0:
        return p_yes / (p_yes + p_no)
    return parse_label(_content(body))


# ------------------------------------------------------------------------------------------ bounding a reply


def bound_replies(client: Any, max_bytes: int, body_s: float) -> None:
    """Add the reply bounds to an httpx (or httpx2) client's event hooks, once. The response hook runs before the
    client reads the body, so it is the hook that reads it, within the bounds."""
    hooks = client.event_hooks
    if any(isinstance(h, _ReplyBound) for h in hooks.get("response", [])):
        return
    client.event_hooks = {
        **hooks,
        "request": [*hooks.get("request", []), _ask_identity],
        "response": [*hooks.get("response", []), _ReplyBound(max_bytes, body_s)],
    }


def _ask_identity(request: Any) -> None:
    # A compressed body could decode to any size from a few bytes on the wire: ask for it as it is.
    request.headers["Accept-Encoding"] = "identity"


class _ReplyBound:
    """An httpx response hook: reads the body itself, at most `max_bytes` and within `body_s` seconds, then hands
    the client the bytes read. Raises JudgeBadOutput / JudgeTimeout naming the URL."""

    def __init__(self, max_bytes: int, body_s: float):
        self.max_bytes, self.body_s = max_bytes, body_s

    def __call__(self, response: Any) -> None:
        url = str(response.request.url)
        encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            raise JudgeBadOutput(
                f"{url}: the reply is compressed (Content-Encoding: {encoding[:40]}) although "
                f"identity was asked for; its decoded size cannot be bounded"
            )
        declared = response.headers.get("Content-Length", "").strip()
        if len(declared) > 12 or (declared.isdigit() and int(declared) > self.max_bytes):
            raise JudgeBadOutput(
                f"{url}: the reply body is {declared[:20]} bytes, over the cap of {self.max_bytes} bytes"
            )
        body = self._read(response.stream, url)
        response.stream.close()  # the connection goes back to the pool; the client reads the copy below
        response.stream = _byte_stream(response, body)

    def _read(self, stream: Any, url: str) -> bytes:
        deadline = time.monotonic() + self.body_s
        chunks, size = [], 0
        for chunk in stream:
            size += len(chunk)
            if size > self.max_bytes:
                raise JudgeBadOutput(f"{url}: the reply body is over the cap of {self.max_bytes} bytes")
            if time.monotonic() > deadline:
                raise JudgeTimeout(f"{url}: the reply body did not arrive within {self.body_s:g}s")
            chunks.append(chunk)
        return b"".join(chunks)


def _byte_stream(response: Any, body: bytes) -> Any:
    # httpx and httpx2 each accept only their own stream class: take the one of the library this response is from.
    return importlib.import_module(type(response).__module__.partition(".")[0]).ByteStream(body)
