"""sampling/openai_stream.py's two chunkers (chat and completions) cut a finished answer the same way: the first
chunk of a choice carries its logprobs, the last its finish_reason and token-id extensions; a usage chunk last."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")

from posttrain.sampling.openai_stream import chat_chunks, completion_chunks

BASE = {"id": "x", "created": 1, "model": "m", "policy_version": 3, "usage": {"total_tokens": 9}}


def test_chat_chunks_of_two_choices():
    out = {**BASE, "prompt_token_ids": [1, 2], "choices": [
        {"index": 0, "message": {"content": "a" * 40}, "logprobs": {"lp": 0}, "finish_reason": "stop",
         "token_ids": [5]},
        {"index": 1, "message": {"content": ""}, "logprobs": None, "finish_reason": "length"},
    ]}
    chunks = list(chat_chunks(out, include_usage=True))
    head = {"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m", "system_fingerprint": None,
            "policy_version": 3, "usage": None}
    assert chunks == [
        {**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": {"lp": 0},
                              "finish_reason": None}], "prompt_token_ids": [1, 2]},
        {**head, "choices": [{"index": 0, "delta": {"content": "a" * 32}, "logprobs": None, "finish_reason": None}]},
        {**head, "choices": [{"index": 0, "delta": {"content": "a" * 8}, "logprobs": None, "finish_reason": "stop",
                              "token_ids": [5]}]},
        {**head, "choices": [{"index": 1, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                              "finish_reason": "length"}]},
        {**head, "choices": [], "usage": {"total_tokens": 9}},
    ]
    assert list(chat_chunks({**BASE, "choices": []}, include_usage=True))[0] == {**head, "choices": [],
                                                                                 "usage": {"total_tokens": 9}}


def test_completion_chunks_of_two_choices():
    out = {**BASE, "choices": [
        {"index": 0, "text": "b" * 33, "logprobs": {"lp": 1}, "finish_reason": "stop", "token_ids": [7],
         "prompt_token_ids": [1]},
        {"index": 1, "text": "", "logprobs": None, "finish_reason": "length"},
    ]}
    head = {"id": "x", "object": "text_completion", "created": 1, "model": "m", "system_fingerprint": None,
            "policy_version": 3}
    assert list(completion_chunks(out, include_usage=False)) == [
        {**head, "choices": [{"index": 0, "text": "b" * 32, "logprobs": {"lp": 1}, "finish_reason": None}]},
        {**head, "choices": [{"index": 0, "text": "b", "logprobs": None, "finish_reason": "stop", "token_ids": [7],
                              "prompt_token_ids": [1]}]},
        {**head, "choices": [{"index": 1, "text": "", "logprobs": None, "finish_reason": "length"}]},
    ]
