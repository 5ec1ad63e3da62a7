"""Parse Hermes/Qwen-style tool calls out of model text: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

This is the format Qwen2.5/Qwen3, Hermes and SmolLM3 chat templates ask the model to use when `tools` are given.
A block that is not valid JSON, or has no string `name`, is reported in `errors` and left in `content`, so a
broken call is visible to whoever reads the reply (and to a reward function), not silently dropped.

Block arguments: a string argument whose value is exactly BLOCK ("```") takes the text of a fenced code block
written before the call in the same reply (after the previous call), the blocks in order of the arguments that
ask for one. Code inside a JSON string must escape every quote, backslash and newline, and small policies get
that wrong (a coding-agent run: 32 of 38 malformed calls were code escaped wrongly); in a fenced block code is
written as it is. The block's text is everything between its fence lines, the final newline included; a fence
is three or more backticks (a longer one can hold a line of three), with an optional info string (```python).
A `<tool_call>` written inside a closed fenced block is quoted text (code that parses tool calls, an example in
prose), never a call: it stays in the block, and an unclosed one there does not swallow the calls after the block.
"""

from __future__ import annotations

import json
import re
from typing import Any

TOOL_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
BLOCK = "```"
# A fence line (3+ backticks and an info string without backticks), the block, the same fence closing it.
FENCED_RE = re.compile(r"^(`{3,})[^`\n]*\n(.*?)^\1[ \t]*$\n?", re.DOTALL | re.MULTILINE)


def fenced_block(text: str, info: str = "") -> str:
    """`text` as a fenced block that FENCED_RE reads back exactly: a fence longer than any backtick run at the start
    of one of its lines. `text` should end with a newline (else the block adds one)."""
    runs = [len(m.group(0)) for m in re.finditer(r"^`+", text, re.MULTILINE)]
    fence = "`" * max(3, max(runs, default=0) + 1)
    body = text if text.endswith("\n") else text + "\n"
    return f"{fence}{info}\n{body}{fence}\n"


def _fill_blocks(args: dict[str, Any], before: str) -> tuple[dict[str, Any], str, str | None]:
    """Block arguments (see the module docstring) filled from the fenced blocks in `before`, in order: (arguments,
    `before` without the blocks used, an error or None)."""
    wanted = [k for k, v in args.items() if v == BLOCK]
    if not wanted:
        return args, before, None
    blocks = list(FENCED_RE.finditer(before))
    if len(blocks) < len(wanted):
        return args, before, (f"{len(wanted)} argument(s) ({', '.join(wanted)}) are {BLOCK!r} but {len(blocks)} "
                              "fenced block(s) come before the call")
    used = blocks[-len(wanted):]  # the blocks nearest the call: earlier ones may be quoted prose
    filled = {**args, **{k: m.group(2) for k, m in zip(wanted, used)}}
    kept, at = [], 0
    for m in used:
        kept.append(before[at:m.start()])
        at = m.end()
    kept.append(before[at:])
    return filled, "".join(kept), None


def parse_tool_calls(text: str) -> tuple[str, list[dict[str, Any]], list[str]]:
    """Split `text` into (content without the parsed call blocks, calls, errors).

    Each call is `{"name": str, "arguments": dict}`. An unterminated final block (the model ran out of tokens)
    is parsed if its JSON is complete.
    """
    calls: list[dict[str, Any]] = []
    errors: list[str] = []
    kept: list[str] = []
    pos = at = 0
    quoted = [(f.start(), f.end()) for f in FENCED_RE.finditer(text)]
    while m := TOOL_CALL_RE.search(text, at):
        fence_end = next((e for s, e in quoted if s <= m.start() < e), None)
        if fence_end is not None:  # inside a fenced block: quoted, look again after the block
            at = fence_end
            continue
        at = m.end()
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
        args, kept[-1], err = _fill_blocks(args, kept[-1])
        if err:
            errors.append(f"tool call {name!r}: {err}")
            kept.append(m.group(0))
            continue
        calls.append({"name": name, "arguments": args})
    kept.append(text[pos:])
    return "".join(kept).strip(), calls, errors
