"""Tool-call parsers by model family, in a name registry (`TOOL_PARSERS`), and the family read from a chat template.

Each parser is a pure function `(text, schemas) -> ParsedReply(content, calls, errors)` (tool_calls.py), calls as
`{"name": str, "arguments": dict}`. Names and formats follow vLLM's parsers of the same name:

    hermes        <tool_call>{"name": ..., "arguments": {...}}</tool_call>        Qwen2.5/Qwen3, Hermes, SmolLM3
                  (tool_calls.py; also what this package's own tool prompts ask for)
    llama3        {"name": ..., "parameters": {...}}, optionally after <|python_tag|>, several joined by ";"
                                                                                  Llama 3.1 to 3.3 JSON tool calling
    mistral       [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]            Mistral tokenizers before v11
                  [TOOL_CALLS]name[ARGS]{...} (or name[CALL_ID]id[ARGS]{...}, or name{...}), repeated per call: v11+
    qwen3_coder   <tool_call><function=name><parameter=x>value</parameter>...</function></tool_call>
                                                                                  Qwen3-Coder (XML; values are text)

A Qwen3-Coder value is text; where the tool's JSON schema (`schemas`: a tool's name -> its `parameters`) types the
parameter as integer, number, boolean, null, object or array, a value that reads as that JSON is that value (vLLM
does the same), else it stays text.

Bounds (the text is model output, hostile): tool_calls.py's reply, call and name caps; JSON through
posttrain.bounded; every search is str.find forward from where the last one ended, so a parse is linear in the
reply, except llama3's JSON decodes, each from one `{"name"` position: at most MAX_JSON_TRIES, of which MAX_BAD_CALLS
that do not read (such a decode may scan to the end of the reply).

`markers`: the strings a format writes that a tokenizer may hold as special tokens, which the samplers' decoded
text drops (`[TOOL_CALLS]` in Mistral's tokenizers); reply_parsers.py puts them back from the token ids.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from posttrain.bounded import BoundedError, decode_json_prefix, loads_json
from posttrain.sampling.tool_calls import (
    CLOSE,
    MAX_CALLS,
    OPEN,
    ParsedReply,
    Schemas,
    call_arguments,
    checked_call,
    parse_tool_calls,
    too_long,
    too_many,
)

MAX_BAD_CALLS = 8  # llama3: call-shaped JSON that does not read; past this many the rest is not searched
MAX_JSON_TRIES = 2 * MAX_CALLS  # llama3: JSON objects read from `{"name"` positions in one reply
WINDOW = 1 << 16  # llama3: characters a JSON value is read within first
MAX_PARAMETERS = 256  # of one XML call


@dataclass(frozen=True)
class ToolFormat:
    name: str
    parse: Callable[[str, Schemas | None], ParsedReply]
    markers: tuple[str, ...]


# ---- llama3 --------------------------------------------------------------------------------------------------------
PYTHON_TAG = "<|python_tag|>"
_CALL_START = re.compile(r'\{\s*"name"\s*:')


def parse_llama3(text: str, schemas: Schemas | None = None) -> ParsedReply:
    """Llama 3.x JSON calls: every `{"name": ..., "parameters" | "arguments": ...}` object in the reply (other JSON is
    text); `<|python_tag|>` before a call and `;` between calls are dropped from the content."""
    if (long := too_long(text)) is not None:
        return long
    calls: list[dict[str, Any]] = []
    errors: list[str] = []
    spans: list[tuple[int, int]] = []
    bad = tries = at = 0
    while (m := _CALL_START.search(text, at)) is not None:
        tries += 1
        if tries > MAX_JSON_TRIES or len(calls) == MAX_CALLS:
            errors.append(
                f"more than {MAX_CALLS} tool calls or {MAX_JSON_TRIES} JSON objects in one reply: the rest was not read"
            )
            break
        start = m.start()
        try:
            obj, end = _decode_at(text, start)
        except BoundedError as e:
            errors.append(f"tool call is not valid JSON ({e.reason}): {text[start : start + 200]}")
            bad += 1
            if bad == MAX_BAD_CALLS:
                break
            at = start + 1
            continue
        at = end
        if not ("parameters" in obj or "arguments" in obj):
            continue  # JSON with a "name" in the text, not a call
        parsed = call_arguments(obj, text[start:end])
        if isinstance(parsed, str):
            errors.append(parsed)
            continue
        calls.append({"name": parsed[0], "arguments": parsed[1]})
        spans.append((start, end))
    return ParsedReply(_without(text, spans, PYTHON_TAG, ";"), calls, errors)


def _decode_at(text: str, start: int) -> tuple[Any, int]:
    """The JSON value at `start` and where it ends, read within the next WINDOW characters first (a call fits), the
    whole rest only where that fails: posttrain.bounded scans all the text it is given for lone surrogates, so each
    of a reply's many small objects would cost the whole reply. A value that closes in the window is the same value
    whatever follows it."""
    if len(text) - start > WINDOW:
        try:
            obj, end = decode_json_prefix(text[start : start + WINDOW])
            return obj, start + end
        except BoundedError:
            pass
    obj, end = decode_json_prefix(text[start:])
    return obj, start + end


def _without(text: str, spans: list[tuple[int, int]], tag: str, joiner: str) -> str:
    """`text` without the call spans, a `tag` right before a call, and gaps of only `joiner` between calls."""
    if not spans:
        return text.strip()
    kept, pos = [], 0
    for i, (start, end) in enumerate(spans):
        gap = text[pos:start]
        if i and not gap.strip(" \t\r\n" + joiner):
            gap = ""
        stripped = gap.rstrip()
        if stripped.endswith(tag):
            gap = stripped[: -len(tag)]
        kept.append(gap)
        pos = end
    kept.append(text[pos:])
    return "".join(kept).strip()


# ---- mistral -------------------------------------------------------------------------------------------------------
TOOL_CALLS, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"


def parse_mistral(text: str, schemas: Schemas | None = None) -> ParsedReply:
    """Mistral calls: the text before the first `[TOOL_CALLS]` is content; each `[TOOL_CALLS]` then starts a JSON
    list (or object) of calls, or one `name[ARGS]{...}` call. Text after a call's JSON stays in the content."""
    if (long := too_long(text)) is not None:
        return long
    head, marker, rest = text.partition(TOOL_CALLS)
    if not marker:
        return ParsedReply(text.strip(), [], [])
    kept, calls, errors = [head], [], []
    pieces = rest.split(TOOL_CALLS, MAX_CALLS)  # the last piece holds the rest, unsplit
    for i, piece in enumerate(pieces):
        if not piece.strip():
            continue  # [TOOL_CALLS] written twice
        found = _mistral_piece(piece) if i < MAX_CALLS else None
        if found is None or (not isinstance(found, str) and len(calls) + len(found[0]) > MAX_CALLS):
            errors.append(too_many())
            kept += [TOOL_CALLS + p for p in pieces[i:]]
            break
        if isinstance(found, str):
            errors.append(found)
            kept.append(TOOL_CALLS + piece)
            continue
        calls += found[0]
        kept.append(found[1])
    if not calls and not errors:  # only markers, nothing after them
        return ParsedReply(text.strip(), [], [f"{TOOL_CALLS} with no call after it"])
    return ParsedReply("".join(kept).strip(), calls, errors)


def _mistral_piece(piece: str) -> tuple[list[dict[str, Any]], str] | str:
    """(calls, the text after them) of what follows one `[TOOL_CALLS]`, or the error."""
    s = piece.lstrip()
    if s.startswith(("[", "{")):  # before v11: a JSON list of {"name", "arguments"} (or one object)
        try:
            obj, end = decode_json_prefix(s)
        except BoundedError as e:
            return f"tool calls are not valid JSON ({e.reason}): {s[:200]}"
        found = []
        for item in obj if isinstance(obj, list) else [obj]:
            parsed = call_arguments(item, s[:end])
            if isinstance(parsed, str):
                return parsed
            found.append({"name": parsed[0], "arguments": parsed[1]})
        return found, s[end:]
    ends = [i for i in (s.find(ARGS), s.find(CALL_ID), s.find("{")) if i >= 0]
    if not ends:
        return f"tool call has no arguments ({ARGS} or {{...}}): {s[:200]}"
    name, j = s[: min(ends)].strip(), min(ends)
    if not name or any(c.isspace() for c in name):
        return f"tool call has no name before its arguments: {s[:200]}"
    if s.startswith(CALL_ID, j):  # name[CALL_ID]id[ARGS]{...}: the id is the model's, ours are made by the server
        j = s.find(ARGS, j)
        if j < 0:
            return f"tool call {name[:100]!r} has no {ARGS}: {s[:200]}"
    if s.startswith(ARGS, j):
        j += len(ARGS)
    while j < len(s) and s[j].isspace():
        j += 1
    try:
        args, end = decode_json_prefix(s, j)
    except BoundedError as e:
        return f"tool call {name[:100]!r} arguments are not valid JSON ({e.reason}): {s[j : j + 200]}"
    parsed = checked_call(name, args)
    return parsed if isinstance(parsed, str) else ([{"name": parsed[0], "arguments": parsed[1]}], s[end:])


# ---- qwen3_coder ---------------------------------------------------------------------------------------------------
FUNCTION, FUNCTION_END, PARAMETER, PARAMETER_END = "<function=", "</function>", "<parameter=", "</parameter>"
_WRAP_END = re.compile(r"[ \t\r\n]*" + re.escape(CLOSE))


def parse_qwen3_coder(text: str, schemas: Schemas | None = None) -> ParsedReply:
    """Qwen3-Coder XML calls, each `<function=name>` up to its `</function>` (its `<tool_call>` wrapper taken with
    it; vLLM reads a call without the wrapper too). A call never closed is an error, not a call with a cut value."""
    if (long := too_long(text)) is not None:
        return long
    kept, calls, errors = [], [], []
    pos = at = 0
    while (start := text.find(FUNCTION, at)) >= 0:
        close = text.find(FUNCTION_END, start)
        if close < 0:
            errors.append(f"tool call is not closed with {FUNCTION_END}: {text[start : start + 200]}")
            break  # nothing after it is closed either
        end = close + len(FUNCTION_END)
        at = end
        if len(calls) == MAX_CALLS:
            errors.append(too_many())
            break
        parsed = _xml_call(text[start + len(FUNCTION) : close], schemas)
        if isinstance(parsed, str):
            errors.append(parsed)
            continue
        gap = text[pos:start]
        if gap.rstrip().endswith(OPEN):
            gap = gap.rstrip()[: -len(OPEN)]
        if (m := _WRAP_END.match(text, end)) is not None:
            end = at = m.end()
        kept.append(gap)
        pos = end
        calls.append({"name": parsed[0], "arguments": parsed[1]})
    kept.append(text[pos:])
    return ParsedReply("".join(kept).strip(), calls, errors)


def _xml_call(inner: str, schemas: Schemas | None) -> tuple[str, dict[str, Any]] | str:
    """(name, arguments) of `name>` + parameters, the text between `<function=` and `</function>`."""
    gt = inner.find(">")
    if gt < 0:
        return f"tool call has no '>' after its name: {inner[:200]}"
    name = inner[:gt].strip()
    types = _properties(schemas, name)
    args: dict[str, Any] = {}
    at, closed = gt + 1, True  # closed: a </parameter> is still ahead (else no later value searches for one)
    while (p := inner.find(PARAMETER, at)) >= 0:
        if len(args) == MAX_PARAMETERS:
            return f"tool call {name[:100]!r} has more than {MAX_PARAMETERS} parameters"
        gt = inner.find(">", p)
        if gt < 0:
            return f"tool call {name[:100]!r}: a parameter has no '>' after its name"
        key = inner[p + len(PARAMETER) : gt].strip()
        value_end = inner.find(PARAMETER_END, gt) if closed else -1
        closed = value_end >= 0
        following = inner.find(PARAMETER, gt)
        if value_end < 0 or 0 <= following < value_end:  # not closed: it ends where the next one starts
            value_end = following if following >= 0 else len(inner)
            at = value_end
        else:
            at = value_end + len(PARAMETER_END)
        args[key] = _typed(_unwrap(inner[gt + 1 : value_end]), types.get(key))
    return checked_call(name, args)


def _unwrap(value: str) -> str:
    """The value without the one newline the template writes on each side of it."""
    value = value[1:] if value.startswith("\n") else value
    return value[:-1] if value.endswith("\n") else value


def _properties(schemas: Schemas | None, name: str) -> Mapping[str, Any]:
    props = (schemas or {}).get(name, {})
    props = props.get("properties") if isinstance(props, Mapping) else None
    return props if isinstance(props, Mapping) else {}


_JSON_KINDS: dict[str, Callable[[Any], bool]] = {
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
}


def _typed(value: str, schema: Any) -> Any:
    """`value` as the JSON its schema's type says, where it reads as that; else the text (a string parameter, a
    parameter the schema does not name, a value that does not parse)."""
    kind = schema.get("type") if isinstance(schema, Mapping) else None
    for k in kind if isinstance(kind, list) else [kind]:
        if k == "string":
            return value
        if k in _JSON_KINDS:
            try:
                parsed = loads_json(value)
            except BoundedError:
                continue
            if _JSON_KINDS[k](parsed):
                return parsed
    return value


# ---- the registry and the family of a template -------------------------------------------------------------------
TOOL_PARSERS: dict[str, ToolFormat] = {
    "hermes": ToolFormat("hermes", parse_tool_calls, (OPEN, CLOSE)),
    "llama3": ToolFormat("llama3", parse_llama3, (PYTHON_TAG,)),
    "mistral": ToolFormat("mistral", parse_mistral, (TOOL_CALLS, ARGS, CALL_ID)),
    "qwen3_coder": ToolFormat("qwen3_coder", parse_qwen3_coder, (OPEN, CLOSE)),
}
# What a chat template writes for its family's calls, all of a row's markers present; the first row that matches
# wins (Qwen3-Coder's templates also write <tool_call>). A template with none: hermes, the format the server's and
# the tool env's own tool prompts ask for.
FAMILY_MARKERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("qwen3_coder", (FUNCTION, PARAMETER)),
    ("mistral", (TOOL_CALLS,)),
    ("llama3", (PYTHON_TAG,)),
    ("hermes", (OPEN,)),
)


def detect_tool_parser(template: str) -> str:
    """The tool parser a chat template's text asks for (see FAMILY_MARKERS)."""
    return next((name for name, marks in FAMILY_MARKERS if all(m in template for m in marks)), "hermes")


# ---- a forced call (the server's tool_choice "required" / a named function) --------------------------------------
# Per JSON-shaped family: (the call's opening up to the function's name, what follows the name up to the arguments,
# what follows the arguments), as its chat template writes a call, so the next turn's re-rendered prompt extends it.
CALL_PARTS: dict[str, tuple[str, str, str]] = {
    "hermes": (OPEN + '\n{"name": "', '", "arguments": ', "}\n" + CLOSE),
    "llama3": ('{"name": "', '", "parameters": ', "}"),
}
# The other families: their opening only (mistral's `[TOOL_CALLS]` before either of its formats; Qwen3-Coder's XML).
OPENINGS: dict[str, str] = {"mistral": TOOL_CALLS, "qwen3_coder": OPEN + "\n<function="}


def forced_opening(family: str, name: str | None = None) -> str:
    """The text a reply of `family` starts with when it must call a tool (`name`: that function, written in where
    the family's opening names it; JSON-escaped). Empty for an unknown family."""
    if family in CALL_PARTS:
        head, mid, _ = CALL_PARTS[family]
        return head + (json.dumps(name)[1:-1] + mid if name is not None else "")
    if family == "qwen3_coder" and name is not None:
        return OPENINGS[family] + name + ">\n"
    return OPENINGS.get(family, "")
