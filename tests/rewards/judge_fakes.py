"""Fakes for judge tests: an in-memory backend and a fake OpenAI-compatible chat server (FastAPI + uvicorn in a
thread, on 127.0.0.1; no network)."""

from __future__ import annotations

import math
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from posttrain.rewards.judges.errors import JudgeError


@dataclass
class FakeBackend:
    """Answers yes_prob by a function of the prompt; counts calls and prompts. `fail`: prompt -> error to return
    in its place (per prompt); `raise_all`: an error the whole call raises; `sleep_s`: per call."""

    answer: Any = lambda p: 0.9 if "good" in p else 0.1
    judge_id: str = "fake:1"
    fail: dict[str, JudgeError] = field(default_factory=dict)
    raise_all: Exception | None = None
    sleep_s: float = 0.0
    text: Any = None  # generate: prompt -> text
    calls: int = 0
    prompts_seen: list[str] = field(default_factory=list)

    def yes_prob(self, prompts):
        self.calls += 1
        self.prompts_seen += prompts
        if self.sleep_s:
            time.sleep(self.sleep_s)
        if self.raise_all is not None:
            raise self.raise_all
        return [self.fail[p] if p in self.fail else self.answer(p) for p in prompts]

    def generate(self, prompts, max_tokens):
        self.calls += 1
        self.prompts_seen += prompts
        if self.raise_all is not None:
            raise self.raise_all
        return [self.fail[p] if p in self.fail else self.text(p) for p in prompts]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FakeJudgeServer:
    """An OpenAI-compatible /v1/chat/completions judge. `mode` (settable while running):
    "logprobs" (top_logprobs with Yes/No), "text" (no logprobs; answers "Yes"/"No" in text), "malformed"
    (answers "Maybe"), "slow" (sleeps `sleep_s` first), "error500" (HTTP 500), "flaky" (500 for the first
    `flaky_failures` requests, then "logprobs"). Yes when the message contains "good". Counts requests."""

    def __init__(self, mode: str = "logprobs", sleep_s: float = 2.0, flaky_failures: int = 1):
        from fastapi import FastAPI
        from fastapi.responses import JSONResponse

        self.mode, self.sleep_s, self.flaky_failures = mode, sleep_s, flaky_failures
        self.requests = 0
        app = FastAPI()

        @app.get("/v1/models")
        async def models():
            return {"object": "list", "data": [{"id": "fake-judge", "object": "model"}]}

        @app.post("/v1/chat/completions")
        async def chat(body: dict):
            import asyncio

            self.requests += 1
            mode = self.mode
            if mode == "flaky":
                mode = "error500" if self.requests <= self.flaky_failures else "logprobs"
            if mode == "slow":
                await asyncio.sleep(self.sleep_s)
                mode = "logprobs"
            if mode == "error500":
                return JSONResponse({"error": {"message": "boom"}}, status_code=500)
            msg = body["messages"][-1]["content"]
            yes = "good" in msg
            if mode == "malformed":
                content, logprobs = "Maybe", None
            elif mode == "text":
                content, logprobs = ("Yes" if yes else "No"), None
            else:
                py = 0.8 if yes else 0.2
                content = "Yes" if yes else "No"
                tops = [{"token": "Yes", "logprob": math.log(py), "bytes": None},
                        {"token": "No", "logprob": math.log(1 - py), "bytes": None}]
                logprobs = {"content": [{"token": content, "logprob": math.log(max(py, 1 - py)), "bytes": None,
                                         "top_logprobs": tops}]}
            return {"id": "x", "object": "chat.completion", "created": 0, "model": "fake-judge",
                    "choices": [{"index": 0, "finish_reason": "stop", "logprobs": logprobs,
                                 "message": {"role": "assistant", "content": content}}]}

        import uvicorn

        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> "FakeJudgeServer":
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started and time.time() < deadline:
            time.sleep(0.02)
        assert self.server.started, "fake judge server did not start"
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
