"""Answer extraction: the one documented step between a completion and the answer a reward compares.

    extract_answer(text, "auto")        <answer>...</answer>, else the last \\boxed{...}, else the last line
    extract_answer(text, "answer_tag")  the last <answer>...</answer> (None when there is none)
    extract_answer(text, "boxed")       the last \\boxed{...} / \\fbox{...}, braces balanced
    extract_answer(text, "last_line")   the last non-empty line
    extract_answer(text, "last_number") the last number (sign, decimals, thousands commas, a fraction a/b)
    extract_answer(text, "none")        the whole text, stripped
    has_answer(text, how)               whether the text gives its answer in that format (the `format` reward)

Every reward that compares an answer (rewards/named.py, reasoning-gym's scorers) calls this instead of parsing
the text its own way, so `task.answer_format` changes them all at once. Model text is hostile: every method looks
at most at the last MAX_SCAN_CHARS characters and runs in linear time (no backtracking pattern on a long line).
"""

from __future__ import annotations

import re
from collections.abc import Callable

MAX_SCAN_CHARS = 20_000  # an answer sits at the end; a megabyte of preamble is not read
MAX_ANSWER_CHARS = 2_000  # what any method returns at most

_OPEN_TAG = re.compile(r"<answer>", re.IGNORECASE)
_CLOSE_TAG = re.compile(r"</answer>", re.IGNORECASE)
# A number: sign, digits with optional thousands commas, decimals, an optional /denominator. No nested
# quantifiers over the same characters: linear on any input.
_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+(?:\.\d+)?)?|[-+]?\.\d+")


def _tail(text: str) -> str:
    return text[-MAX_SCAN_CHARS:] if len(text) > MAX_SCAN_CHARS else text


def _clip(s: str | None) -> str | None:
    if s is None:
        return None
    s = s.strip()
    return s[:MAX_ANSWER_CHARS] if s else None


def last_match(pattern: re.Pattern[str], text: str, end: int | None = None) -> re.Match[str] | None:
    """The last match of `pattern` in `text[:end]`, or None."""
    found = None
    for found in pattern.finditer(text, 0, len(text) if end is None else end):  # noqa: B007 - keeps the last match
        pass
    return found


def answer_tag(text: str) -> str | None:
    """The content of the last complete <answer>...</answer> (from the last closing tag back to the opening tag
    nearest it); without one, an opened tag never closed gives what follows it. Two linear scans: a lazy
    `<answer>(.*?)</answer>` would rescan the text from every one of ten thousand opening tags."""
    t = _tail(text)
    close = last_match(_CLOSE_TAG, t)
    opened = last_match(_OPEN_TAG, t, close.start()) if close else None
    if close and opened:
        return _clip(t[opened.end() : close.start()])
    opened = last_match(_OPEN_TAG, t)
    return _clip(t[opened.end() :]) if opened else None


_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")


def boxed(text: str) -> str | None:
    """The content of the last \\boxed{...} (or \\fbox{...}) whose braces close, nested braces balanced; None
    without one. One pass pairs every brace (linear: a text of ten thousand unclosed boxes costs one scan)."""
    t = _tail(text)
    close: dict[int, int] = {}
    stack: list[int] = []
    for i, ch in enumerate(t):
        if ch == "{":
            stack.append(i)
        elif ch == "}" and stack:
            close[stack.pop()] = i
    for m in reversed(list(_BOX.finditer(t))):
        o = m.end() - 1
        if o in close:
            return _clip(t[o + 1 : close[o]])
    return None


def last_line(text: str) -> str | None:
    lines = [ln for ln in _tail(text).splitlines() if ln.strip()]
    return _clip(lines[-1]) if lines else None


def last_number(text: str) -> str | None:
    """The last number written, commas dropped ("1,234.5" -> "1234.5", "3/4" stays a fraction)."""
    found = _NUMBER.findall(_tail(text))
    return _clip(re.sub(r"\s+", "", found[-1]).replace(",", "")) if found else None


def auto(text: str) -> str | None:
    """<answer> tags, else \\boxed{}, else the last line: the formats prompts ask for, most explicit first."""
    for fn in (answer_tag, boxed, last_line):
        got = fn(text)
        if got is not None:
            return got
    return None


def whole(text: str) -> str | None:
    return _clip(_tail(text))


EXTRACTORS: dict[str, Callable[[str], str | None]] = {
    "auto": auto,
    "answer_tag": answer_tag,
    "boxed": boxed,
    "last_line": last_line,
    "last_number": last_number,
    "none": whole,
}


def extract_answer(text: str, how: str = "auto") -> str | None:
    """The answer in `text` by the method named `how` (EXTRACTORS); None when the text holds none."""
    try:
        fn = EXTRACTORS[how]
    except KeyError:
        raise ValueError(f"unknown answer format {how!r}; known: {', '.join(EXTRACTORS)}") from None
    return fn(text if isinstance(text, str) else str(text))


def has_answer(text: str, how: str = "auto") -> bool:
    """Whether `text` gives its answer in the format `how` (the `format` reward): answer_tag a closed
    <answer>...</answer> with something in it, boxed a closed \\boxed{...} with something in it, auto either of the
    two (not the last-line fallback: any text has a last line); the other formats, an answer they can read."""
    text = text if isinstance(text, str) else str(text)
    if how == "auto":
        return has_answer(text, "answer_tag") or has_answer(text, "boxed")
    if how == "answer_tag":
        t = _tail(text)
        close = last_match(_CLOSE_TAG, t)
        opened = last_match(_OPEN_TAG, t, close.start()) if close else None
        return bool(close and opened and t[opened.end() : close.start()].strip())
    return extract_answer(text, how) is not None


def completion_text(completion: object) -> str:
    """A TRL-style completion (a string, or a list of chat messages) as the text of its last message."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content") or "")
    return "" if completion is None else str(completion)
