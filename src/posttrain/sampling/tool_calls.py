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

Bounds (model text is hostile): a reply over MAX_REPLY_CHARS is not searched for calls; at most MAX_CALLS calls
are parsed from one reply (the rest stay in `content`, with one error); a name is at most MAX_NAME_CHARS; JSON is
read by posttrain.bounded (size and depth caps). `call_arguments` and these caps are shared by the other
families' parsers (tool_parsers.py).
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Mapping
from typing import Any, NamedTuple

from posttrain.bounded import MAX_JSON_CHARS, BoundedError, loads_json

OPEN, CLOSE = "<tool_call>", "</tool_call>"
BLOCK = "```"
MAX_REPLY_CHARS = MAX_JSON_CHARS  # a reply longer than this is not searched for calls
MAX_CALLS = 64  # calls parsed from one reply; more is a runaway loop, not a plan
MAX_NAME_CHARS = 256
# A tool's name -> its JSON-schema `parameters`: what a format whose arguments are text (XML) reads types from.
Schemas = Mapping[str, Mapping[str, Any]]


class ParsedReply(NamedTuple):
    """A reply split into its text and its tool calls (each `{"name": str, "arguments": dict}`), with one error per
    call-shaped part that could not be read (left in `content`, so a broken call stays visible)."""

    content: str
    calls: list[dict[str, Any]]
    errors: list[str]


def too_long(text: str) -> ParsedReply | None:
    """The answer for a reply over MAX_REPLY_CHARS (not searched), else None."""
    if len(text) <= MAX_REPLY_CHARS:
        return None
    return ParsedReply(
        text, [], [f"a reply of {len(text)} characters is not searched for tool calls (at most {MAX_REPLY_CHARS})"]
    )


def too_many() -> str:
    return f"more than {MAX_CALLS} tool calls in one reply: the calls after the first {MAX_CALLS} were not read"


def fenced_block(text: str, info: str = "") -> str:
    """`text` as a fenced block that `fenced_blocks` reads back exactly: a fence longer than any backtick run at
    the start of one of its lines. `text` should end with a newline (else the block adds one)."""
    runs = [len(m.group(0)) for m in re.finditer(r"^`+", text, re.MULTILINE)]
    fence = "`" * max(3, max(runs, default=0) + 1)
    body = text if text.endswith("\n") else text + "\n"
    return f"{fence}{info}\n{body}{fence}\n"


def _line_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of each line, end at its newline or the end of the text."""
    spans, at = [], 0
    while at < len(text):
        nl = text.find("\n", at)
        end = len(text) if nl < 0 else nl
        spans.append((at, end))
        at = end + 1
    return spans


def fenced_blocks(text: str) -> list[tuple[int, int, str]]:
    """The fenced blocks of `text`, in order, as (start, end, body): a line of 3+ backticks and an info string
    without backticks, then the body, then a line of the same fence (spaces or tabs after it allowed), its newline
    part of the block. An opening fence never closed is not a block; the search goes on from its next line.

    This is the regex `^(`{3,})[^`\n]*\n(.*?)^\1[ \t]*$\n?` (MULTILINE, DOTALL) with `finditer`, done in
    O(n log n): that regex re-scans to the end of the text from every unclosed fence, which a reply of many
    fences of different lengths makes quadratic."""
    spans = _line_spans(text)
    runs = [len(text[s:e]) - len(text[s:e].lstrip("`")) for s, e in spans]
    closers: dict[int, list[int]] = {}
    for i, ((s, e), r) in enumerate(zip(spans, runs)):
        if r >= 3 and not text[s + r : e].strip(" \t"):
            closers.setdefault(r, []).append(i)
    blocks, i = [], 0
    while i < len(spans):
        (s, e), r = spans[i], runs[i]
        opener = r >= 3 and e < len(text) and "`" not in text[s + r : e]
        later = closers.get(r, []) if opener else []
        k = bisect.bisect_right(later, i)
        if k == len(later):
            i += 1
            continue
        j = later[k]
        end = min(spans[j][1] + 1, len(text))
        blocks.append((s, end, text[e + 1 : spans[j][0]]))
        i = j + 1
    return blocks


def _fill_blocks(args: dict[str, Any], before: str) -> tuple[dict[str, Any], str, str | None]:
    """Block arguments (see the module docstring) filled from the fenced blocks in `before`, in order: (arguments,
    `before` without the blocks used, an error or None)."""
    wanted = [k for k, v in args.items() if v == BLOCK]
    if not wanted:
        return args, before, None
    blocks = fenced_blocks(before)
    if len(blocks) < len(wanted):
        return (
            args,
            before,
            (
                f"{len(wanted)} argument(s) ({', '.join(wanted)}) are {BLOCK!r} but {len(blocks)} "
                "fenced block(s) come before the call"
            ),
        )
    used = blocks[-len(wanted) :]  # the blocks nearest the call: earlier ones may be quoted prose
    filled = {**args, **{k: body for k, (_, _, body) in zip(wanted, used)}}
    kept, at = [], 0
    for start, end, _ in used:
        kept.append(before[at:start])
        at = end
    kept.append(before[at:])
    return filled, "".join(kept), None


def _next_call(text: str, at: int) -> tuple[int, int, str] | None:
    """(start, end, body) of the first `<tool_call>` block at or after `at`: up to its closing tag, or to the end
    of the text when it has none. With str.find, so linear (a lazy regex to the tag re-scans whitespace runs)."""
    start = text.find(OPEN, at)
    if start < 0:
        return None
    close = text.find(CLOSE, start + len(OPEN))
    if close < 0:
        return start, len(text), text[start + len(OPEN) :]
    return start, close + len(CLOSE), text[start + len(OPEN) : close]


def _quoted_end(quoted: list[tuple[int, int, str]], starts: list[int], pos: int) -> int | None:
    """End of the fenced block that contains `pos`, or None."""
    k = bisect.bisect_right(starts, pos) - 1
    return quoted[k][1] if k >= 0 and pos < quoted[k][1] else None


def call_arguments(obj: Any, body: str) -> tuple[str, dict[str, Any]] | str:
    """(name, arguments) of a decoded `{"name", "arguments" | "parameters"}` call, or the error to report."""
    name = obj.get("name") if isinstance(obj, dict) else None
    if not isinstance(name, str) or not name.strip():
        return f"tool call has no 'name': {body[:200]}"
    return checked_call(name, obj.get("arguments", obj.get("parameters", {})))


def checked_call(name: str, args: Any) -> tuple[str, dict[str, Any]] | str:
    """(name, arguments as a dict) or the error to report: a name within MAX_NAME_CHARS, arguments an object (or a
    JSON string of one, as some models write them)."""
    name = name.strip()
    if not name or len(name) > MAX_NAME_CHARS:
        return f"tool call name must be 1 to {MAX_NAME_CHARS} characters: {name[:100]!r}"
    if isinstance(args, str):  # some models emit arguments as a JSON string already
        try:
            args = loads_json(args)
        except BoundedError:
            return f"tool call {name!r} arguments are not valid JSON: {args[:200]}"
    if not isinstance(args, dict):
        return f"tool call {name!r} arguments must be an object, got {type(args).__name__}"
    return name, args


def parse_tool_calls(text: str, schemas: Schemas | None = None) -> ParsedReply:
    """Split `text` into (content without the parsed call blocks, calls, errors).

    Each call is `{"name": str, "arguments": dict}`. An unterminated final block (the model ran out of tokens)
    is parsed if its JSON is complete. Never raises on any text: JSON too deep or too large for
    posttrain.bounded is an error like any invalid JSON. `schemas` is unused (JSON arguments carry their types).
    """
    if (long := too_long(text)) is not None:
        return long
    if OPEN not in text:  # no call: skip the fence scan (seconds on a megabyte of short lines)
        return ParsedReply(text.strip(), [], [])
    calls: list[dict[str, Any]] = []
    errors: list[str] = []
    kept: list[str] = []
    pos = at = 0
    quoted = fenced_blocks(text)
    starts = [q[0] for q in quoted]
    while (found := _next_call(text, at)) is not None:
        start, end, raw = found
        fence_end = _quoted_end(quoted, starts, start)
        if fence_end is not None:  # inside a fenced block: quoted, look again after the block
            at = fence_end
            continue
        if len(calls) == MAX_CALLS:
            errors.append(too_many())
            break
        at = end
        kept.append(text[pos:start])
        pos = end
        body = raw.strip()
        try:
            parsed = call_arguments(loads_json(body), body)
        except BoundedError as e:
            parsed = f"tool call is not valid JSON ({e.reason}): {body[:200]}"
        if isinstance(parsed, str):
            errors.append(parsed)
            kept.append(text[start:end])
            continue
        name, args = parsed
        args, kept[-1], err = _fill_blocks(args, kept[-1])
        if err:
            errors.append(f"tool call {name!r}: {err}")
            kept.append(text[start:end])
            continue
        calls.append({"name": name, "arguments": args})
    kept.append(text[pos:])
    return ParsedReply("".join(kept).strip(), calls, errors)
