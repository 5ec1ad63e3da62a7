"""A judge backend on any OpenAI-compatible chat endpoint (`posttrain serve`, vLLM, SGLang, a hosted API), through
the `openai` client (the `judge` extra: pip install 'posttrain[judge]').

Yes/no questions ask for one token at temperature 0 with `logprobs` and `top_logprobs`; P(Yes) is read from the
top alternatives (summed over "yes"/"no" spellings) when the server returns them. A server that returns none
(`posttrain serve` returns only the sampled token's logprob) gives a hard verdict from the answer text: 1.0 for
"Yes", 0.0 for "No", anything else is malformed output.

Each prompt is its own request (the chat API has no batch of conversations); a batch is sent concurrently,
`max_concurrency` at a time. The client's own retries are off (`max_retries=0`): the runner retries, bounded, so
one policy holds for every backend. Every request has the client timeout `timeout_s`.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from posttrain.rewards.judges.backends import is_no_token, is_yes_token, yes_no_from_text
from posttrain.rewards.judges.errors import (JudgeBadOutput, JudgeError, JudgeRequestError, JudgeTimeout,
                                             JudgeUnavailable)


class OpenAIBackend:
    def __init__(self, base_url: str, model: str | None = None, api_key: str | None = None, timeout_s: float = 30.0,
                 max_concurrency: int = 8, top_logprobs: int = 10, http_client: Any = None):
        """`base_url`: the server root or its /v1. `model`: the served model's name (default: the first of
        /v1/models, asked once). `api_key`: default $OPENAI_API_KEY, else a placeholder (local servers ignore
        it). `http_client`: an httpx.Client to use (tests pass one with a mock transport)."""
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        root = base_url.rstrip("/")
        self.base_url = root if root.endswith("/v1") else root + "/v1"
        self.model = model
        self.api_key = api_key or os.environ.get("OPENAI_API_KEY") or "x"
        self.timeout_s, self.max_concurrency, self.top_logprobs = timeout_s, max_concurrency, top_logprobs
        self._http_client = http_client
        self._client: Any = None

    @property
    def judge_id(self) -> str:
        """Names the served model, so a cache never mixes two judges behind one URL. Resolving it asks /v1/models
        once; an endpoint that cannot answer gives '?' (its calls fail, and failures are never cached)."""
        if self.model is None:
            try:
                self._model_name()
            except JudgeError:
                return f"openai:{self.base_url}:?"
        return f"openai:{self.base_url}:{self.model}"

    def _openai(self) -> Any:
        if self._client is None:
            try:
                import openai
            except ImportError as e:  # pragma: no cover - depends on the install
                raise ImportError("the OpenAI judge backend needs the 'judge' extra: pip install 'posttrain[judge]'") from e
            self._client = openai.OpenAI(base_url=self.base_url, api_key=self.api_key, timeout=self.timeout_s,
                                         max_retries=0, http_client=self._http_client)
        return self._client

    def _model_name(self) -> str:
        if self.model is None:
            models = self._wrap(lambda: self._openai().models.list().data)
            if not models:
                raise JudgeRequestError(f"{self.base_url}/models lists no model; pass model=...")
            self.model = models[0].id
        return self.model

    def _wrap(self, fn):
        """Call the client, mapping its exceptions onto the judge's error kinds."""
        import openai

        try:
            return fn()
        except openai.APITimeoutError as e:
            raise JudgeTimeout(f"{self.base_url}: no answer within {self.timeout_s:g}s") from e
        except openai.APIConnectionError as e:
            raise JudgeUnavailable(f"{self.base_url}: cannot connect ({e.__cause__ or e})") from e
        except openai.APIStatusError as e:
            msg = f"{self.base_url}: HTTP {e.status_code}: {str(e.message)[:300]}"
            if e.status_code in (408, 429) or e.status_code >= 500:
                raise JudgeUnavailable(msg) from e
            raise JudgeRequestError(msg) from e

    def _each(self, prompts: list[str], one) -> list[Any]:
        self._model_name()  # once, before the fan-out, so a dead endpoint fails the whole call at once
        if len(prompts) == 1:
            return [_catch(one, prompts[0])]
        with ThreadPoolExecutor(max_workers=max(1, min(self.max_concurrency, len(prompts)))) as pool:
            return list(pool.map(lambda p: _catch(one, p), prompts))

    def yes_prob(self, prompts: list[str]) -> list[float | Exception]:
        def one(prompt: str) -> float:
            resp = self._wrap(lambda: self._openai().chat.completions.create(
                model=self.model, messages=[{"role": "user", "content": prompt}], max_tokens=1, temperature=0.0,
                logprobs=True, top_logprobs=self.top_logprobs))
            return _yes_prob_from_choice(resp.choices[0] if resp.choices else None)

        return self._each(prompts, one)

    def generate(self, prompts: list[str], max_tokens: int) -> list[str | Exception]:
        def one(prompt: str) -> str:
            resp = self._wrap(lambda: self._openai().chat.completions.create(
                model=self.model, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens,
                temperature=0.0))
            if not resp.choices or resp.choices[0].message.content is None:
                raise JudgeBadOutput(f"{self.base_url} returned no message content")
            return resp.choices[0].message.content

        return self._each(prompts, one)


def _catch(fn, arg):
    try:
        return fn(arg)
    except JudgeError as e:
        return e


def _yes_prob_from_choice(choice: Any) -> float:
    if choice is None:
        raise JudgeBadOutput("the judge returned no choices")
    content = getattr(getattr(choice, "logprobs", None), "content", None) or []
    tops = getattr(content[0], "top_logprobs", None) or [] if content else []
    p_yes = sum(math.exp(t.logprob) for t in tops if is_yes_token(t.token))
    p_no = sum(math.exp(t.logprob) for t in tops if is_no_token(t.token))
    if p_yes + p_no > 0:
        return p_yes / (p_yes + p_no)
    text = (choice.message.content if choice.message is not None else None) or ""
    verdict = yes_no_from_text(text)
    if verdict is None:
        raise JudgeBadOutput(f"expected Yes or No, the judge answered {text[:80]!r}")
    return verdict
