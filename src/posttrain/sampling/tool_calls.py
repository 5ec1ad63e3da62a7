"""Parse Hermes/Qwen-style tool calls out of model text: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

This is the format Qwen2.5/Qwen3, Hermes and SmolLM3 chat templates ask the model to use when `tools` are given.
A block that is not valid JSON, or has no string `name`, is reported in `errors` and left in `content`, so a
broken call is visible to whoever reads the reply (and to a reward function), not silently dropped.
"""

from __future__ import annotations

import json
import re
from typing import Any

TOOL_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


def parse_tool_calls(text: str) -> tuple[str, list[dict[str, Any]], list[str]]:
    """Split `text` into (content without the parsed call blocks, calls, errors).

    Each call is `{"name": str, "arguments": dict}`. An unterminated final block (the model ran out of tokens)
    is parsed if its JSON is complete.
    """
    calls: list[dict[str, Any]] = []
    errors: list[str] = []
    kept: list[str] = []
    pos = 0
    for m in TOOL_CALL_RE.finditer(text):
        kept.append(text[pos : m.start()])
        pos = m.end()
        body = m.group(1).strip()
        try:
            obj = json.loads(body)
        except json.JSONDecodeError as e:
            errors.append(f"tool call is not valid JSON ({e.msg}): {body[:200]}")
            kept.append(m.group(0))
            continue
        name = obj.get("name") if isinstance(obj, dict) else None
        if not isinstance(name, str) or not name:
            errors.append(f"tool call has no 'name': {body[:200]}")
            kept.append(m.group(0))
            continue
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):  # some models emit arguments as a JSON string already
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                errors.append(f"tool call {name!r} arguments are not valid JSON: {args[:200]}")
                kept.append(m.group(0))
                continue
        if not isinstance(args, dict):
            errors.append(f"tool call {name!r} arguments must be an object, got {type(args).__name__}")
            kept.append(m.group(0))
            continue
        calls.append({"name": name, "arguments": args})
    kept.append(text[pos:])
    return "".join(kept).strip(), calls, errors
