"""A Sampler over any OpenAI-compatible server (vLLM, SGLang, llama.cpp, `posttrain serve`), tokens in and out.

Prompts go to `/v1/completions` as token-id lists (`"prompt": [[ids...], ...]`), never as text, so the server
sees exactly the tokens the env built. Completion token ids come back in one of two ways, tried in order:

1. `choices[i].token_ids` (vLLM >= 0.10.2 and `posttrain serve` with `"return_token_ids": true`);
2. `choices[i].logprobs.tokens` written as "token_id:123" (vLLM's `"return_tokens_as_token_ids": true`).

A server that gives neither is rejected with an error naming these two options (re-tokenizing the text would
not give back the sampled tokens). Logprobs come from `"logprobs": 0` (the sampled token's logprob only).

What the server must do:
  * accept token-id prompts on /v1/completions (vLLM, SGLang and `posttrain serve` do; llama.cpp's server
    accepts `prompt` as a token list too, but returns no token ids: it is not enough for training);
  * return token ids (above) and per-token logprobs;
  * for logprobs that match our convention, softmax(logits / temperature) of the sampling distribution,
    start vLLM with `--logprobs-mode processed_logprobs` (its default returns the raw model distribution).
    The trainer's off-policy correction logs the mismatch either way.

Every request has a timeout on the whole exchange (a server that trickles bytes does not escape it). Timeouts,
connection errors (refused, reset, a body cut short), 429 and 5xx answers are retried with exponential backoff
(`backoff_s * 2**attempt`, at most `max_retries` retries); each timeout is counted in `stats["timeouts"]` and
logged. What the server says is checked before anything uses it, and a failure is one of two kinds:

* `OpenAISamplerError`: the server cannot serve the run. It stopped answering (after the retries), refused the
  request (4xx), or lacks what training needs (token ids, logprobs, a model). Infrastructure
  (envs/isolate.py INFRASTRUCTURE): it stops the run.
* `OpenAIReplyError` (a ValueError): one reply was malformed: larger than its cap (refused as soon as the header
  or the stream says so, before it is buffered), not UTF-8 JSON, the wrong shape, logprobs that do not match the
  tokens or are not finite numbers, token ids that are not integers of the vocabulary, more tokens than
  max_tokens. Not retried; the samples of that request fail (`safe_rollout`), the run goes on.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
from typing import Any, cast

import httpx

from posttrain.bounded import BoundedError, loads_json
from posttrain.errors import PosttrainError
from posttrain.sampling.context import ContextBudget
from posttrain.types import Completion, SampleParams

log = logging.getLogger(__name__)
_RETRY_STATUS = {408, 429, 500, 502, 503, 504}
_TOKEN_ID = re.compile(r"token_id:(-?\d{1,12})")
MODELS_REPLY_BYTES = 1 << 20  # /v1/models: a list of names
ERROR_REPLY_BYTES = 4096  # of a 4xx/5xx body: enough for the server's message
REPLY_BASE_BYTES = 1 << 20
# Per token of a completion, vLLM writes its id, "token_id:N", its logprob, a one-entry top_logprobs, an offset
# and the token's text (JSON-escaped, up to 6 bytes a character): about 200 bytes. Twice that and more.
REPLY_BYTES_PER_TOKEN = 512
REPLY_BYTES_PER_CHOICE = 4096


class OpenAISamplerError(PosttrainError, RuntimeError):
    """The server cannot serve this run (stopped answering, refused the request, lacks a needed feature).
    Infrastructure: stops the run (envs/isolate.py)."""


class OpenAIReplyError(ValueError):
    """One reply was malformed (too large, not JSON, the wrong shape, bad tokens or logprobs): the samples of
    that request fail, not the run. Deliberately not an OpenAISamplerError."""


def reply_cap(choices: int, max_tokens: int) -> int:
    """The most bytes a well-formed reply of `choices` completions of at most `max_tokens` tokens needs."""
    return REPLY_BASE_BYTES + choices * (REPLY_BYTES_PER_CHOICE + REPLY_BYTES_PER_TOKEN * max(max_tokens, 1))


class OpenAISampler:
    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        tokenizer: Any = None,
        api_key: str = "x",
        timeout_s: float = 300.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        max_prompts_per_request: int = 64,
        extra_body: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        vocab_size: int | None = None,
        max_response_bytes: int | None = None,
        context: ContextBudget | None = None,
    ):
        """`base_url` is the server root or its /v1 (both work). `model` defaults to the first of /v1/models.
        `tokenizer` (the served model's) is needed for `decode`, and gives the vocabulary token ids are checked
        against unless `vocab_size` says it (a model whose embedding is padded past its tokenizer). A reply is
        refused past `max_response_bytes` (default: `reply_cap` of the request). `policy_version` is what
        completions are tagged with unless the server reports one; bump it after each weight sync."""
        root = base_url.rstrip("/")
        self.base_url = root if root.endswith("/v1") else root + "/v1"
        self.model = model
        self.tokenizer = tokenizer
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_prompts_per_request = max_prompts_per_request
        self.extra_body = dict(extra_body or {})
        self.headers = {"Authorization": f"Bearer {api_key}", **(headers or {})}
        self.vocab_size = vocab_size if vocab_size is not None else _vocab_of(tokenizer)
        self.max_response_bytes = max_response_bytes
        # The served model's context (the trainer knows its model): a prompt past it fails its own row here, not as
        # a server's 400 for the whole request. None: the server's own check decides.
        self.context = context
        self.policy_version = 0
        self.stats = {"requests": 0, "timeouts": 0, "retries": 0, "errors": 0, "malformed": 0}
        self._client: httpx.AsyncClient | None = None
        self._client_loop: asyncio.AbstractEventLoop | None = None

    def set_version(self, version: int) -> None:
        """The version the server serves now (VersionedPush, after the transport's push): a reply that reports its
        own version still wins."""
        self.policy_version = version

    def decode(self, token_ids: list[int]) -> str:
        if self.tokenizer is None:
            raise OpenAISamplerError("OpenAISampler.decode needs the served model's tokenizer: pass tokenizer=...")
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    async def sample(self, prompts_P: list[list[int]], params: SampleParams, n: int = 1) -> list[list[Completion]]:
        if any(len(p) == 0 for p in prompts_P):
            raise ValueError("empty prompt: every prompt needs at least one token")
        if not prompts_P:
            return []
        if self.context is None:
            return await self._sample(prompts_P, params, n)
        fitted = self.context.fit_rows(prompts_P, params)  # a row past the context fails alone (context.py)
        return fitted.merge(await self._sample(fitted.prompts_P, fitted.params, n), n)

    async def _sample(self, prompts_P: list[list[int]], params: SampleParams, n: int) -> list[list[Completion]]:
        if self.model is None:
            self.model = await self._first_model()
        k = self.max_prompts_per_request
        chunks = [prompts_P[i : i + k] for i in range(0, len(prompts_P), k)]
        parts = await asyncio.gather(*(self._sample_chunk(c, params, n) for c in chunks), return_exceptions=True)
        errors = [p for p in parts if isinstance(p, BaseException)]
        if errors:  # every chunk has finished: none is left running; a dead server outranks a bad reply
            raise next((e for e in errors if isinstance(e, OpenAISamplerError)), errors[0])
        return [g for part in cast("list[list[list[Completion]]]", parts) for g in part]  # no error, checked above

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    # ---- internals ---------------------------------------------------------------------------------------
    def _http(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:  # an httpx client is bound to one event loop
            self._client = httpx.AsyncClient(
                timeout=self.timeout_s,
                headers=self.headers,
                limits=httpx.Limits(max_connections=256, max_keepalive_connections=64),
            )
            self._client_loop = loop
        return self._client

    async def _first_model(self) -> str:
        """The first model /v1/models lists. Anything wrong here stops the run: nothing can be sampled."""
        try:
            data = await self._request("GET", "/models", None, MODELS_REPLY_BYTES)
        except OpenAIReplyError as e:
            raise OpenAISamplerError(f"{self.base_url}/models: {e}; pass model=...") from None
        models = data.get("data") if isinstance(data, dict) else None
        first = models[0] if isinstance(models, list) and models else None
        if not (isinstance(first, dict) and isinstance(first.get("id"), str)):
            raise OpenAISamplerError(f"{self.base_url}/models lists no model id; pass model=...")
        return first["id"]

    async def _sample_chunk(self, prompts: list[list[int]], params: SampleParams, n: int) -> list[list[Completion]]:
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": [list(map(int, p)) for p in prompts],
            "n": n,
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "logprobs": 0,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": True,
            **self.extra_body,
        }
        if params.top_k:
            body["top_k"] = params.top_k
        if params.stop:
            body["stop"] = list(params.stop)
        if params.seed is not None:
            body["seed"] = params.seed
        max_tokens = body["max_tokens"] if type(body.get("max_tokens")) is int else params.max_tokens  # extra_body's
        cap = self.max_response_bytes or reply_cap(len(prompts) * n, max_tokens)
        data = await self._request("POST", "/completions", body, cap)
        try:
            comps = self._completions(data, len(prompts) * n, max_tokens)
        except OpenAIReplyError as e:
            self.stats["malformed"] += 1
            raise OpenAIReplyError(f"{self.base_url}/completions: {e}") from None
        return [comps[i * n : (i + 1) * n] for i in range(len(prompts))]

    def _completions(self, data: Any, expected: int, max_tokens: int) -> list[Completion]:
        """The reply's completions in request order, each checked; OpenAIReplyError names what is wrong."""
        if not isinstance(data, dict):
            raise OpenAIReplyError(f"reply is a JSON {type(data).__name__}, not a JSON object")
        choices = data.get("choices")
        if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
            raise OpenAIReplyError("'choices' is not a list of objects (one choice per completion)")
        if len(choices) != expected:
            raise OpenAIReplyError(f"expected {expected} choices, got {len(choices)}")
        index = [c.get("index", i) for i, c in enumerate(choices)]  # no index: in order
        if sorted(i if type(i) is int else -1 for i in index) != list(range(expected)):
            raise OpenAIReplyError(f"choice indices {str(index)[:80]} are not 0..{expected - 1}, each once")
        version = data.get("policy_version", self.policy_version)
        if type(version) is not int:
            raise OpenAIReplyError(f"policy_version {str(version)[:40]!r} is not an integer")
        ordered = sorted(zip(index, choices), key=lambda ic: ic[0])
        return [self._completion(c, version, max_tokens) for _, c in ordered]

    def _completion(self, choice: dict[str, Any], version: int, max_tokens: int) -> Completion:
        lp = choice.get("logprobs") or {}
        if not isinstance(lp, dict):
            raise OpenAIReplyError(f"a choice's 'logprobs' is a JSON {type(lp).__name__}, not an object")
        ids = _token_ids(choice, lp)
        if ids is None:
            raise OpenAISamplerError(
                f"{self.base_url} returned no completion token ids. The server must support `return_token_ids` "
                "(vLLM >= 0.10.2, posttrain serve) or `return_tokens_as_token_ids` (vLLM)"
            )
        logps = lp.get("token_logprobs")
        if logps is None:
            raise OpenAISamplerError(f"{self.base_url} returned no logprobs; the server must support `logprobs: 0`")
        self._check_tokens(ids, logps, max_tokens)
        text = choice.get("text")
        if text is not None and not isinstance(text, str):
            raise OpenAIReplyError(f"a choice's 'text' is a JSON {type(text).__name__}, not a string")
        reason = choice.get("finish_reason") or "stop"
        return Completion(
            token_ids=list(ids),
            logprobs=[float(x) for x in logps],
            finish_reason="length" if reason == "length" else "stop",
            policy_version=version,
            text=text or "",
        )

    def _check_tokens(self, ids: Any, logps: Any, max_tokens: int) -> None:
        """Token ids: integers of the vocabulary (the trainer indexes its embedding with them: out of range is a
        crash there, on CUDA a device-side assert); logprobs: one finite number per token; at most max_tokens."""
        if not isinstance(ids, list) or not isinstance(logps, list):
            raise OpenAIReplyError("token ids and logprobs must be JSON lists")
        if len(logps) != len(ids):
            raise OpenAIReplyError(f"{len(logps)} logprobs for {len(ids)} tokens")
        if len(ids) > max_tokens:
            raise OpenAIReplyError(f"{len(ids)} tokens, more than max_tokens={max_tokens}")
        vocab = self.vocab_size
        for i in ids:
            if type(i) is not int:  # not bool, not 6.0, not "6": the server is not sending token ids
                raise OpenAIReplyError(f"token id {str(i)[:40]!r} is not an integer")
            if i < 0 or (vocab is not None and i >= vocab):
                top = "" if vocab is None else vocab - 1
                raise OpenAIReplyError(f"token id {i} is outside the vocabulary (0..{top})")
        for x in logps:
            if type(x) not in (int, float) or not math.isfinite(x):
                raise OpenAIReplyError(f"logprob {str(x)[:40]!r} is not a finite number")

    async def _request(self, method: str, path: str, body: dict[str, Any] | None, cap: int) -> Any:
        """The parsed JSON of a 2xx reply of at most `cap` bytes. Transport failures, timeouts and 408/429/5xx
        are retried, then OpenAISamplerError; a malformed reply is OpenAIReplyError at once."""
        url = self.base_url + path
        for attempt in range(self.max_retries + 1):
            self.stats["requests"] += 1
            try:  # the deadline covers the whole exchange: httpx's timeout is per read, which trickling resets
                status, raw = await asyncio.wait_for(self._exchange(method, url, body, cap), self.timeout_s)
            except (TimeoutError, httpx.TimeoutException):
                self.stats["timeouts"] += 1
                why = f"timeout after {self.timeout_s}s ({self.stats['timeouts']} timeouts so far)"
            except httpx.TransportError as e:  # refused, reset, closed without a reply, a body cut short
                why = f"{type(e).__name__}: {e}"
            except OpenAIReplyError as e:
                self.stats["malformed"] += 1
                raise OpenAIReplyError(f"{method} {url}: {e}") from None
            else:
                if 200 <= status < 300:
                    return self._parse(raw, method, url, cap)
                text = raw.decode("utf-8", "replace")[:500]
                if status not in _RETRY_STATUS:
                    self.stats["errors"] += 1
                    raise OpenAISamplerError(f"{method} {url} -> HTTP {status}: {text}")
                why = f"HTTP {status}"
            if attempt == self.max_retries:
                self.stats["errors"] += 1
                raise OpenAISamplerError(f"{method} {url} failed after {attempt + 1} attempts: {why}")
            delay = self.backoff_s * 2**attempt
            self.stats["retries"] += 1
            log.warning("%s %s: %s; retry %d/%d in %.2fs", method, url, why, attempt + 1, self.max_retries, delay)
            await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    async def _exchange(self, method: str, url: str, body: dict[str, Any] | None, cap: int) -> tuple[int, bytes]:
        """(status, body bytes): a success's body up to `cap` (more is OpenAIReplyError), an error's first 4 KiB."""
        async with self._http().stream(method, url, json=body) as r:
            if not 200 <= r.status_code < 300:
                return r.status_code, await _read_bytes(r, ERROR_REPLY_BYTES, cut=True)
            return r.status_code, await _read_bytes(r, cap)

    def _parse(self, raw: bytes, method: str, url: str, cap: int) -> Any:
        try:
            return loads_json(raw.decode("utf-8"), max_chars=cap)  # depth capped; NaN and Infinity refused
        except (BoundedError, UnicodeDecodeError) as e:
            self.stats["malformed"] += 1
            raise OpenAIReplyError(f"{method} {url}: reply is not JSON: {e}") from None


async def _read_bytes(r: httpx.Response, cap: int, cut: bool = False) -> bytes:
    """The body of `r`, refused (OpenAIReplyError) as soon as its Content-Length or the bytes read pass `cap`,
    before it is buffered whole; with `cut`, its first `cap` bytes instead."""
    declared = r.headers.get("content-length")
    if not cut and declared is not None and declared.isdigit() and int(declared) > cap:
        raise OpenAIReplyError(f"reply larger than {cap} bytes (Content-Length {declared})")
    body = bytearray()
    async for chunk in r.aiter_bytes():
        body += chunk
        if len(body) > cap:
            if cut:
                return bytes(body[:cap])
            raise OpenAIReplyError(f"reply larger than {cap} bytes")
    return bytes(body)


def _vocab_of(tokenizer: Any) -> int | None:
    """len(tokenizer): its vocabulary with the added tokens; None without a tokenizer (ids then need only be >= 0)."""
    try:
        return len(tokenizer) if tokenizer is not None else None
    except TypeError:  # an object without a length: no vocabulary to check against
        return None


def _token_ids(choice: dict[str, Any], lp: dict[str, Any]) -> Any:
    """The completion's token ids: `token_ids`, else `logprobs.tokens` as "token_id:N" strings; None when the
    server sent neither (it lacks the feature). Their types are checked by the caller."""
    ids = choice.get("token_ids")
    if ids is not None:
        return ids
    toks = lp.get("tokens")
    if not (isinstance(toks, list) and toks and all(isinstance(t, str) and t.startswith("token_id:") for t in toks)):
        return None
    found = [_TOKEN_ID.fullmatch(t) for t in toks]
    return [int(m.group(1)) if m else t for m, t in zip(found, toks)]  # a bad one stays a string: refused later
