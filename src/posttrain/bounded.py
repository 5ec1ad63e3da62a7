"""Bounded host-side work on model text: every parse of what a policy wrote goes through here.

A policy in RL searches for whatever crashes or stalls the host, so text it wrote is parsed only with a size cap,
a nesting (recursion) cap and a time cap, and every failure comes out as one exception type, `BoundedError` (a
`ValueError`), with a message a model can read:

    loads_json(text)                    json.loads after a linear pre-scan of bracket depth; no NaN / Infinity,
                                        no number that becomes an infinite float (1e999), no int past Python's
                                        4300-digit conversion limit, no string with a lone surrogate
    decode_json_prefix(text, start)     the first JSON value at `start` and where it ends (raw_decode), bounded
    parse_python(source)                ast.parse with size, depth and node caps (RecursionError, MemoryError,
                                        SyntaxError and NUL bytes become BoundedError)
    walk(tree)                          an AST walk without recursion, in the order ast.NodeVisitor visits
                                        (a tree that parsed can still be too deep for a recursive visitor)
    (model-written regexes: bounded_regex.py, check_pattern and search_lines in a worker process)
    clip(text, n)                       a string cut to n characters before a regex or a parse looks at it
    truncate_text(text, n)              text for the model to read (a tool result, an observation) cut to n
                                        characters with a visible marker saying how much was cut

Nothing here keeps a cache that model text can grow. Imports only the stdlib (the worker imports `regex`).
"""

from __future__ import annotations

import ast
import json
import math
import re
import threading
import warnings
from collections.abc import Iterator
from typing import Any

MAX_JSON_CHARS = 1 << 20  # a tool call or an answer; larger is not something a policy needs to write
MAX_JSON_DEPTH = 64  # json's C scanner recurses per level; what reads the value afterwards often does too
MAX_PYTHON_CHARS = 256_000  # a coding-agent file is at most 32000 characters; a completion a few 10k
MAX_PYTHON_DEPTH = 200  # AST levels; a recursive visitor needs about two frames per level
MAX_PYTHON_NODES = 200_000  # ~100 bytes and more per node


class BoundedError(ValueError):
    """Model text that is too large, too deep, too slow or invalid to parse. `reason` is the short cause."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class BoundedTimeout(BoundedError):
    """The work ran past its time budget (and was stopped)."""


class WorkerDied(BoundedError):
    """A worker process ended in the middle of a call (its memory or CPU limit, or a kill from outside)."""


def clip(text: str, max_chars: int) -> str:
    """`text` cut to `max_chars` characters: what a fixed regex or a parser may look at."""
    return text if len(text) <= max_chars else text[:max_chars]


# ------------------------------------------------------------------------------------------------------------ JSON

# One event per string delimiter, escape pair or bracket: the pre-scan's loop runs per event, not per character.
_JSON_EVENTS = re.compile(r'\\.|["\[\]{}]', re.DOTALL)


def truncate_text(text: str, max_chars: int) -> tuple[str, int]:
    """(text, characters cut): `text` whole when it fits, else its head with a marker the model reads, the whole
    within `max_chars` (when the marker itself fits). Cut before tokenizing: a 5 MB tool result would otherwise
    be tokenized whole and sent into the next prompt."""
    if len(text) <= max_chars:
        return text, 0
    cut = len(text) - max_chars
    marker = f"\n...[truncated: {cut} more characters]"
    marker = f"\n...[truncated: {cut + len(marker)} more characters]"  # the marker takes room of its own
    keep = max(max_chars - len(marker), 0)
    return text[:keep] + marker, len(text) - keep


def json_depth_ok(text: str, start: int = 0, max_depth: int = MAX_JSON_DEPTH) -> None:
    """Raise BoundedError if the first JSON value at `start` nests deeper than `max_depth`. Linear: counts
    brackets outside strings and stops where that value closes (what follows it, json never recurses into)."""
    depth, in_string = 0, False
    for m in _JSON_EVENTS.finditer(text, start):
        tok = m.group(0)
        if tok == '"':
            in_string = not in_string
            if not in_string and depth == 0:
                return  # a top-level string value has ended
        elif in_string or len(tok) == 2:
            continue  # a bracket inside a string, or an escape pair
        elif tok in "[{":
            depth += 1
            if depth > max_depth:
                raise BoundedError(f"JSON nested deeper than {max_depth} levels")
        else:
            depth -= 1
            if depth <= 0:
                return  # the first value has closed (or the text is invalid there, which json will say)


def _reject_constant(name: str) -> Any:
    raise BoundedError(f"{name} is not valid JSON")


def _finite_float(s: str) -> float:
    # 1e999 parses to inf in json; no JSON a policy writes should mean infinity, and inf breaks the arithmetic
    # (sums, comparisons to 1.0) of whatever scores it, so it is invalid like NaN and Infinity.
    value = float(s)
    if not math.isfinite(value):
        raise BoundedError(f"number {s[:40]} is out of range")
    return value


_DECODER = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite_float)


def check_size(text: str, max_chars: int, what: str) -> None:
    if not isinstance(text, str):
        raise BoundedError(f"{what} must be text, got {type(text).__name__}")
    if len(text) > max_chars:
        raise BoundedError(f"{what} is {len(text)} characters; at most {max_chars}")


_SURROGATE = re.compile("[\ud800-\udfff]")


def _no_lone_surrogates(value: Any) -> None:
    """Raise BoundedError if a string in `value` (keys included) holds a lone surrogate: `"\\ud800"` decodes to
    text that cannot be encoded as UTF-8, which breaks the tokenizer, a file write or a log line downstream. A
    valid escaped pair decodes to one character outside that range. Without recursion."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            if _SURROGATE.search(v):
                raise BoundedError("a string holds a lone surrogate (not valid Unicode text)")
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)


def decode_json_prefix(
    text: str, start: int = 0, max_chars: int = MAX_JSON_CHARS, max_depth: int = MAX_JSON_DEPTH
) -> tuple[Any, int]:
    """The JSON value that starts at `text[start]` and the index where it ends (`JSONDecoder.raw_decode`), with
    the caps of `loads_json`. Raises BoundedError."""
    check_size(text, max_chars, "JSON text")
    json_depth_ok(text, start, max_depth)
    try:
        value, end = _DECODER.raw_decode(text, start)
        if "\\u" in text or _SURROGATE.search(text):  # only an escape or a raw surrogate can put one in a string
            _no_lone_surrogates(value)
        return value, end
    except BoundedError:
        raise
    except json.JSONDecodeError as e:
        raise BoundedError(e.msg) from None
    except ValueError as e:  # an int past the 4300-digit limit
        raise BoundedError(str(e)[:120]) from None
    except (RecursionError, MemoryError) as e:  # the pre-scan should make these unreachable: defence in depth
        raise BoundedError(f"JSON too complex ({type(e).__name__})") from None


def loads_json(text: str, max_chars: int = MAX_JSON_CHARS, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """`json.loads(text)` for model text; raises BoundedError (message: the reason) on anything invalid or over a
    cap. Strict JSON: NaN, Infinity, numbers too large for a float and strings with a lone surrogate are
    invalid."""
    check_size(text, max_chars, "JSON text")
    stripped = text.strip(" \t\n\r")
    value, end = decode_json_prefix(stripped, 0, max_chars, max_depth)
    if end != len(stripped):
        raise BoundedError("Extra data")
    return value


# ---------------------------------------------------------------------------------------------------------- Python

_PARSE_LOCK = threading.Lock()  # warnings.catch_warnings swaps global state: one parse at a time changes it


def parse_python(
    source: str,
    max_chars: int = MAX_PYTHON_CHARS,
    max_depth: int = MAX_PYTHON_DEPTH,
    max_nodes: int = MAX_PYTHON_NODES,
    filename: str = "<model>",
) -> ast.Module:
    """`ast.parse(source)` for model-written code. Raises BoundedError: over the size cap, a NUL byte, a syntax
    error (message 'line N: msg'), a tree deeper than `max_depth` or larger than `max_nodes` (checked without
    recursion, so a recursive visitor of the result cannot overflow), or a parse the interpreter itself refused
    as too deep (RecursionError, MemoryError). Compile-time warnings (invalid escapes, `is` with a literal) are
    silenced: random text would print them on every call."""
    check_size(source, max_chars, "source")
    if "\0" in source:
        raise BoundedError("source contains a NUL byte")
    try:
        with _PARSE_LOCK, warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            tree = ast.parse(source, filename=filename)
    except SyntaxError as e:
        raise BoundedError(f"line {e.lineno}: {e.msg}") from None
    except (RecursionError, MemoryError) as e:
        raise BoundedError(f"nested too deeply to parse ({type(e).__name__})") from None
    except ValueError as e:
        raise BoundedError(str(e)[:120]) from None
    check_tree(tree, max_depth, max_nodes)
    return tree


def check_tree(tree: ast.AST, max_depth: int = MAX_PYTHON_DEPTH, max_nodes: int = MAX_PYTHON_NODES) -> None:
    """Raise BoundedError if `tree` is deeper than `max_depth` levels or has more than `max_nodes` nodes."""
    stack, n = [(tree, 1)], 0
    while stack:
        node, depth = stack.pop()
        n += 1
        if depth > max_depth:
            raise BoundedError(f"code nested deeper than {max_depth} levels")
        if n > max_nodes:
            raise BoundedError(f"code has more than {max_nodes} syntax nodes")
        stack.extend((c, depth + 1) for c in ast.iter_child_nodes(node))


def walk(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node of `tree` in the order a recursive ast.NodeVisitor visits them (pre-order, fields in order),
    with an explicit stack instead of recursion."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(list(ast.iter_child_nodes(node))))
