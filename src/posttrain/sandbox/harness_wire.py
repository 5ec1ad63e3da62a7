"""Runs INSIDE the sandbox (stdlib only): the value encoding between the test process and the solution process.

Only plain data crosses: None, bool, int, float, str as JSON; list, tuple, set, frozenset, dict and bytes as
tagged JSON objects rebuilt from exact builtin types; anything else as a numbered reference that the other side
can only pass back or operate on through the narrow call interface (harness_remote.py / harness_solution.py).
Encoding uses exact type checks, so a subclass of str or int with its own __eq__ crosses as a reference, not as
the builtin it pretends to be. Decoding is depth-limited and rejects any shape it does not know.
"""

import json
import math

MAX_DEPTH = 100
MAX_ITEMS = 100_000  # per message, so one reply cannot make the reader build an unbounded structure
CONTAINERS = {list: "list", tuple: "tuple", set: "set", frozenset: "frozenset"}
BUILDERS = {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}


class WireError(Exception):
    """A message broke the encoding rules."""


def encode(x, ref_of, depth=0, budget=None):
    """x as JSON-ready data; `ref_of(obj)` returns the tagged reference for anything that is not plain."""
    budget = budget if budget is not None else [MAX_ITEMS]
    budget[0] -= 1
    if budget[0] < 0 or depth > MAX_DEPTH:
        raise WireError("value too large or too deeply nested to send")
    t = type(x)
    if x is None or t is bool or t is int or t is str:
        return x
    if t is float:
        return x if math.isfinite(x) else {"float": repr(x)}
    if t in CONTAINERS:
        return {CONTAINERS[t]: [encode(v, ref_of, depth + 1, budget) for v in x]}
    if t is dict:
        return {
            "dict": [[encode(k, ref_of, depth + 1, budget), encode(v, ref_of, depth + 1, budget)] for k, v in x.items()]
        }
    if t is bytes:
        return {"bytes": x.decode("latin-1")}
    return ref_of(x)


def decode(x, from_ref, depth=0, budget=None):
    """The inverse of encode; `from_ref(tagged)` turns a reference into a local object."""
    budget = budget if budget is not None else [MAX_ITEMS]
    budget[0] -= 1
    if budget[0] < 0 or depth > MAX_DEPTH:
        raise WireError("message too large or too deeply nested")
    t = type(x)
    if x is None or t is bool or t is int or t is str or t is float:
        return x
    if t is not dict or len(x) < 1:
        raise WireError(f"unexpected {t.__name__} in a message")
    if "ref" in x:
        return from_ref(x)
    if len(x) != 1:
        raise WireError("unknown tagged value")
    ((tag, body),) = x.items()
    if tag == "float" and body in ("nan", "inf", "-inf"):
        return float(body)
    if tag == "bytes" and type(body) is str:
        return body.encode("latin-1")
    if type(body) is not list:
        raise WireError(f"bad body for {tag!r}")
    if tag in BUILDERS:
        return BUILDERS[tag](decode(v, from_ref, depth + 1, budget) for v in body)
    if tag == "dict":
        out = {}
        for pair in body:
            if type(pair) is not list or len(pair) != 2:
                raise WireError("bad dict item")
            out[decode(pair[0], from_ref, depth + 1, budget)] = decode(pair[1], from_ref, depth + 1, budget)
        return out
    raise WireError(f"unknown tag {tag!r}")


def dumps(obj):
    return (json.dumps(obj, allow_nan=False, separators=(",", ":")) + "\n").encode()


def loads(line):
    """One message; WireError for anything that is not a JSON object (deep nesting included)."""
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError) as e:
        raise WireError(f"not JSON: {type(e).__name__}") from None
    if type(obj) is not dict:
        raise WireError("a message must be a JSON object")
    return obj
