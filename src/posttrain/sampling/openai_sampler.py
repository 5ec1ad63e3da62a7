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

Every request has a timeout. Timeouts, connection errors, 429 and 5xx answers are retried with exponential
backoff (`backoff_s * 2**attempt`, at most `max_retries` retries); each timeout is counted in
`stats["timeouts"]` and logged. A 4xx answer is a bad request: it raises at once with the server's message.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx

from posttrain.types import Completion, SampleParams

log = logging.getLogger(__name__)
_RETRY_STATUS = {408, 429, 500, 502, 503, 504}


class OpenAISamplerError(RuntimeError):
    pass


class OpenAISampler:
    def __init__(self, base_url: str, model: str | None = None, tokenizer: Any = None, api_key: str = "x",
                 timeout_s: float = 300.0, max_retries: int = 3, backoff_s: float = 0.5,
                 max_prompts_per_request: int = 64, extra_body: dict[str, Any] | None = None,
                 headers: dict[str, str] | None = None):
        """`base_url` is the server root or its /v1 (both work). `model` defaults to the first of /v1/models.
        `tokenizer` (the served model's) is only needed for `decode`. `policy_version` is what completions are
        tagged with unless the server reports one; bump it after each weight sync."""
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
        self.policy_version = 0
        self.stats = {"requests": 0, "timeouts": 0, "retries": 0, "errors": 0}
        self._client: httpx.AsyncClient | None = None
        self._client_loop: asyncio.AbstractEventLoop | None = None

    def decode(self, token_ids: list[int]) -> str:
        if self.tokenizer is None:
            raise OpenAISamplerError("OpenAISampler.decode needs the served model's tokenizer: pass tokenizer=...")
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    async def sample(self, prompts_P: list[list[int]], params: SampleParams, n: int = 1) -> list[list[Completion]]:
        if any(len(p) == 0 for p in prompts_P):
            raise ValueError("empty prompt: every prompt needs at least one token")
        if not prompts_P:
            return []
        if self.model is None:
            self.model = await self._first_model()
        k = self.max_prompts_per_request
        chunks = [prompts_P[i : i + k] for i in range(0, len(prompts_P), k)]
        parts = await asyncio.gather(*(self._sample_chunk(c, params, n) for c in chunks))
        return [g for part in parts for g in part]

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    # ---- internals ---------------------------------------------------------------------------------------
    def _http(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:  # an httpx client is bound to one event loop
            self._client = httpx.AsyncClient(timeout=self.timeout_s, headers=self.headers,
                                             limits=httpx.Limits(max_connections=256, max_keepalive_connections=64))
            self._client_loop = loop
        return self._client

    async def _first_model(self) -> str:
        data = await self._request("GET", "/models", None)
        models = data.get("data") or []
        if not models:
            raise OpenAISamplerError(f"{self.base_url}/models lists no model; pass model=...")
        return models[0]["id"]

    async def _sample_chunk(self, prompts: list[list[int]], params: SampleParams, n: int) -> list[list[Completion]]:
        body: dict[str, Any] = {
            "model": self.model, "prompt": [list(map(int, p)) for p in prompts], "n": n,
            "max_tokens": params.max_tokens, "temperature": params.temperature, "top_p": params.top_p,
            "logprobs": 0, "return_token_ids": True, "return_tokens_as_token_ids": True,
            "skip_special_tokens": True, **self.extra_body,
        }
        if params.top_k:
            body["top_k"] = params.top_k
        if params.stop:
            body["stop"] = list(params.stop)
        if params.seed is not None:
            body["seed"] = params.seed
        data = await self._request("POST", "/completions", body)
        choices = sorted(data.get("choices") or [], key=lambda c: c.get("index", 0))
        if len(choices) != len(prompts) * n:
            raise OpenAISamplerError(f"expected {len(prompts) * n} choices from {self.base_url}, got {len(choices)}")
        version = int(data.get("policy_version", self.policy_version))
        comps = [self._completion(c, version) for c in choices]
        return [comps[i * n : (i + 1) * n] for i in range(len(prompts))]

    def _completion(self, choice: dict[str, Any], version: int) -> Completion:
        lp = choice.get("logprobs") or {}
        ids = choice.get("token_ids")
        if ids is None:
            toks = lp.get("tokens") or []
            if toks and all(isinstance(t, str) and t.startswith("token_id:") for t in toks):
                ids = [int(t.split(":", 1)[1]) for t in toks]
        if ids is None:
            raise OpenAISamplerError(
                f"{self.base_url} returned no completion token ids. The server must support `return_token_ids` "
                "(vLLM >= 0.10.2, posttrain serve) or `return_tokens_as_token_ids` (vLLM)")
        logps = lp.get("token_logprobs")
        if logps is None or len(logps) != len(ids):
            raise OpenAISamplerError(f"{self.base_url} returned {0 if logps is None else len(logps)} logprobs for "
                                     f"{len(ids)} tokens; the server must support `logprobs: 0`")
        reason = choice.get("finish_reason") or "stop"
        return Completion(token_ids=[int(i) for i in ids], logprobs=[float(x) for x in logps],
                          finish_reason="length" if reason == "length" else "stop", policy_version=version,
                          text=choice.get("text") or "")

    async def _request(self, method: str, path: str, body: dict[str, Any] | None) -> dict[str, Any]:
        url = self.base_url + path
        for attempt in range(self.max_retries + 1):
            self.stats["requests"] += 1
            why = ""
            try:
                r = await self._http().request(method, url, json=body)
                if r.status_code < 400:
                    return r.json()
                if r.status_code not in _RETRY_STATUS:
                    self.stats["errors"] += 1
                    raise OpenAISamplerError(f"{method} {url} -> HTTP {r.status_code}: {r.text[:500]}")
                why = f"HTTP {r.status_code}"
            except httpx.TimeoutException:
                self.stats["timeouts"] += 1
                why = f"timeout after {self.timeout_s}s ({self.stats['timeouts']} timeouts so far)"
            except httpx.TransportError as e:
                why = f"{type(e).__name__}: {e}"
            if attempt == self.max_retries:
                self.stats["errors"] += 1
                raise OpenAISamplerError(f"{method} {url} failed after {attempt + 1} attempts: {why}")
            delay = self.backoff_s * 2**attempt
            self.stats["retries"] += 1
            log.warning("%s %s: %s; retry %d/%d in %.2fs", method, url, why, attempt + 1, self.max_retries, delay)
            await asyncio.sleep(delay)
        raise AssertionError("unreachable")
