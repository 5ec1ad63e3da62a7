"""The conversations behind /v1/responses' `previous_response_id` (sampling/openai_responses.py), kept in memory
for one server (one run): a least-recently-used store bounded by count and by characters.

Each entry is the conversation as chat messages after that response (the input history and the reply; the
instructions are not kept: OpenAI does not carry them over either). A response continued or looked up moves to
the newest end; past `max_responses` entries or `max_chars` characters together, the least recently used go
first. A continuation of an evicted response is refused (400, `previous_response_not_found`), never answered
with a shorter history.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

MAX_RESPONSES = 4096  # a run's agents each continue their latest response: room for thousands in flight
MAX_CHARS = 64_000_000  # characters of every stored conversation together


class ResponseStore:
    def __init__(self, max_responses: int = MAX_RESPONSES, max_chars: int = MAX_CHARS):
        if max_responses < 1 or max_chars < 1:
            raise ValueError(f"ResponseStore needs room: max_responses={max_responses}, max_chars={max_chars}")
        self.max_responses, self.max_chars = max_responses, max_chars
        self._items: OrderedDict[str, tuple[list[dict[str, Any]], int]] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()

    def put(self, response_id: str, messages: list[dict[str, Any]], chars: int) -> None:
        """Keep `messages` (`chars` characters of text) under `response_id`; one larger than the whole store is
        not kept."""
        with self._lock:
            old = self._items.pop(response_id, None)
            if old is not None:
                self._chars -= old[1]
            if chars > self.max_chars:
                return
            self._items[response_id] = (messages, chars)
            self._chars += chars
            while len(self._items) > self.max_responses or self._chars > self.max_chars:
                _, (_, gone) = self._items.popitem(last=False)
                self._chars -= gone

    def get(self, response_id: str) -> list[dict[str, Any]] | None:
        """The conversation after `response_id` (a copy of the list), or None when it is unknown or evicted."""
        with self._lock:
            entry = self._items.get(response_id)
            if entry is None:
                return None
            self._items.move_to_end(response_id)
            return list(entry[0])

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    @property
    def chars(self) -> int:
        with self._lock:
            return self._chars
