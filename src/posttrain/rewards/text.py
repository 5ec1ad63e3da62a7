"""Helpers shared by reward functions."""

from __future__ import annotations

from typing import Any


def completion_text(completion: Any) -> str:
    """The text of a completion in either TRL format: a string, or a list of chat messages."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    if isinstance(completion, dict):
        return str(completion.get("content", ""))
    return str(completion)
