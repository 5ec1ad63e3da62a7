"""Filling a judge's question template from a sample: `{completion}`, `{prompt}` and any row column by name."""

from __future__ import annotations

import string
from typing import Any

from posttrain.rewards.text import completion_text


def prompt_text(prompt: Any) -> str:
    """The text a judge is shown for a task prompt: a string as is; for chat messages, the last user message
    (the system message and chat roles are the policy's framing, not the question)."""
    if prompt is None:
        return ""
    if isinstance(prompt, str):
        return prompt
    users = [m for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
    return str((users or list(prompt))[-1].get("content", "")) if prompt else ""


def template_fields(template: str) -> set[str]:
    return {f for _, f, _, _ in string.Formatter().parse(template) if f}


def check_template(template: str, required: set[str], name: str) -> None:
    """Fail at construction, not at the first reward call, when a template lacks a field it needs or is malformed."""
    try:
        fields = template_fields(template)
    except ValueError as e:
        raise ValueError(f"{name}: malformed template ({e}): {template[:120]!r}") from None
    missing = required - fields
    if missing:
        raise ValueError(f"{name}: template must contain {sorted('{' + m + '}' for m in missing)}: {template[:120]!r}")


def fill(template: str, values: dict[str, Any], name: str) -> str:
    try:
        return template.format_map({k: completion_text(v) if k == "completion" else v for k, v in values.items()})
    except KeyError as e:
        raise ValueError(
            f"{name}: template field {e} is neither completion, prompt nor a column of the row "
            f"(columns: {sorted(k for k in values if k not in ('completion', 'prompt'))})"
        ) from None


def row_values(i: int, columns: dict[str, list[Any]]) -> dict[str, Any]:
    return {k: v[i] for k, v in columns.items() if isinstance(v, list) and i < len(v)}
