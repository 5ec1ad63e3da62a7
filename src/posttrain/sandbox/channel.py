"""Host-side reading of the result channel: bytes from the sandbox in, checked records out. Never raises.

Everything here treats the channel as hostile. The cost of every step is linear in the bytes read (already
capped by cfg.max_result_bytes): no regex over ids, no recursion deeper than the JSON decoder allows, no more
lines than the protocol can need. A channel that breaks any rule of the protocol scores 0 with an error that
says which rule; nothing is salvaged from it, since a partly forged channel proves nothing.

The protocol (one JSON object per line, written by our harnesses):
    grade_function: {"i": case, "v": value} or {"i": case, "err": name}, each case once; or {"load_error": ...}
                    then {"done": number of case lines}
    grade_pytest:   {"kind": "item", "nodeid": id, "passed": bool} per test item, each id once, ids from the
                    pristine tests; {"kind": "collect_error"|"error"|"tamper", ...}; then {"kind": "done",
                    "count": number of item lines}
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

MAX_LINE_CHARS = 1 << 20  # one record; a case's return value is the largest thing that travels
MAX_MESSAGE_CHARS = 500  # error texts copied into GradeResult.error
FLOAT_TOL = 1e-6


class ChannelError(ValueError):
    """The channel broke the protocol; the message says how."""


def _reject_constant(name: str) -> None:
    raise ValueError(f"non-finite number {name}")


def parse_records(raw: bytes, max_lines: int) -> list[dict]:
    """Every line as a JSON object, in order. Raises ChannelError on any line that is not one, on more than
    `max_lines` lines, and on nesting too deep for the decoder (RecursionError is a ValueError here)."""
    lines = raw.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    if len(lines) > max_lines:
        raise ChannelError(f"{len(lines)} lines on the result channel; the protocol needs at most {max_lines}")
    out = []
    for n, line in enumerate(lines):
        if len(line) > MAX_LINE_CHARS:
            raise ChannelError(f"line {n} is {len(line)} bytes long")
        try:
            obj = json.loads(line.decode("utf-8"), parse_constant=_reject_constant)
        except (ValueError, RecursionError, MemoryError) as e:  # UnicodeDecodeError is a ValueError
            raise ChannelError(f"line {n} is not JSON: {type(e).__name__}") from None
        if type(obj) is not dict:
            raise ChannelError(f"line {n} is not a JSON object")
        out.append(obj)
    return out


def short(x: Any) -> str:
    """A bounded, printable rendering of something that came from the sandbox."""
    s = x if isinstance(x, str) else repr(type(x).__name__)
    return s[:MAX_MESSAGE_CHARS]


def values_equal(expected: Any, got: Any) -> bool:
    """Strict JSON equality; floats (where expected is a float) within 1e-6, relative or absolute.

    Recursion follows `expected` (trusted, shallow), never `got`; an int too large for a float is not equal.
    """
    if isinstance(expected, bool) or expected is None or isinstance(expected, str):
        return type(got) is type(expected) and got == expected
    if isinstance(expected, float):
        if type(got) not in (int, float):
            return False
        try:
            return math.isclose(float(got), expected, rel_tol=FLOAT_TOL, abs_tol=FLOAT_TOL)
        except OverflowError:
            return False
    if isinstance(expected, int):
        return type(got) is int and got == expected
    if isinstance(expected, (list, tuple)):
        return type(got) is list and len(got) == len(expected) and all(map(values_equal, expected, got))
    if isinstance(expected, dict):
        return (
            type(got) is dict
            and len(got) == len(expected)
            and all(type(k) is str for k in got)
            and set(got) == set(expected)
            and all(values_equal(v, got[k]) for k, v in expected.items())
        )
    raise TypeError(f"expected value of type {type(expected).__name__} is not JSON")


@dataclass
class CaseLines:
    """grade_function's channel, checked: per case the returned value (or None when the case raised)."""

    values: dict[int, Any] = field(default_factory=dict)
    raised: set[int] = field(default_factory=set)
    load_error: str | None = None


def read_function_channel(raw: bytes, n_cases: int) -> CaseLines:
    """Check grade_function's channel against the protocol; raises ChannelError when it is broken."""
    records = parse_records(raw, max_lines=n_cases + 2)
    out = CaseLines()
    if not records or set(records[-1]) != {"done"}:
        raise ChannelError("no closing record (the run ended before the harness finished)")
    *body, done = records
    for obj in body:
        if "load_error" in obj:
            if out.load_error is not None or len(body) != 1:
                raise ChannelError("a load error next to other records")
            out.load_error = short(obj["load_error"])
            continue
        i = obj.get("i")
        if type(i) is not int or not 0 <= i < n_cases:
            raise ChannelError(f"record for unknown case {short(str(i))}")
        if i in out.values or i in out.raised:
            raise ChannelError(f"case {i} reported twice")
        if set(obj) == {"i", "v"}:
            out.values[i] = obj["v"]
        elif set(obj) == {"i", "err"}:
            out.raised.add(i)
        else:
            raise ChannelError(f"malformed record for case {i}")
    reported = len(out.values) + len(out.raised)
    if type(done["done"]) is not int or done["done"] != reported:
        raise ChannelError(f"closing record counts {short(str(done['done']))} cases, the channel has {reported}")
    if out.load_error is None and reported != n_cases:
        raise ChannelError(f"{n_cases - reported} of {n_cases} cases did not report")
    return out


def base_id(nodeid: str) -> str:
    """A pytest node id without its parameter suffix: "f.py::test_x[1-a]" -> "f.py::test_x". Linear time."""
    cut = nodeid.find("[")
    return nodeid[:cut] if cut >= 0 and nodeid.endswith("]") else nodeid


@dataclass
class ItemLines:
    """grade_pytest's channel, checked: each reported item's verdict, plus what the harness said went wrong."""

    passed: dict[str, bool] = field(default_factory=dict)  # full node id -> verdict, in report order
    collect_errors: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    tampered: list[str] = field(default_factory=list)
    # Out of process: why the link to the solution process ran out of time, if it did. Every test after that
    # fails for lack of an answer, so those verdicts say the machine (or the solution) was slow, not which tests
    # the code fails: a repair task's baseline must not be read from them.
    link_timeout: str | None = None


def read_pytest_channel(raw: bytes, static_ids: set[str], max_items: int) -> ItemLines:
    """Check grade_pytest's channel: only ids whose base is one of the pristine tests' `static_ids`, each full
    id once, and a closing record with the item count last. Raises ChannelError when it is broken."""
    records = parse_records(raw, max_lines=max_items + 2 * len(static_ids) + 8)
    if not records or records[-1].get("kind") != "done":
        raise ChannelError("no closing record (the test run ended before the harness finished)")
    *body, done = records
    out = ItemLines()
    for obj in body:
        kind = obj.get("kind")
        if kind == "item":
            nodeid, verdict = obj.get("nodeid"), obj.get("passed")
            if type(nodeid) is not str or type(verdict) is not bool:
                raise ChannelError("malformed item record")
            if base_id(nodeid) not in static_ids:
                raise ChannelError(f"result for a test that is not in the pristine tests: {short(nodeid)}")
            if nodeid in out.passed:
                raise ChannelError(f"two results for one test: {short(nodeid)}")
            out.passed[nodeid] = verdict
        elif kind == "collect_error":
            out.collect_errors.append(short(obj.get("nodeid")))
        elif kind == "error":
            out.errors.append(short(obj.get("msg")))
        elif kind == "link":
            out.link_timeout = short(obj.get("why"))
        elif kind == "tamper":
            what = obj.get("what")
            out.tampered += [short(w) for w in what[:20]] if type(what) is list else [short(what)]
        else:
            raise ChannelError(f"record of unknown kind {short(kind)}")
    if type(done.get("count")) is not int or done["count"] != len(out.passed):
        raise ChannelError(
            f"closing record counts {short(str(done.get('count')))} items, the channel has {len(out.passed)}"
        )
    return out
