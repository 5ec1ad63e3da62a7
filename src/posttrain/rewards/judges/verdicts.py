"""Reading a judge's verdict strictly. A judge's reply is hostile input (a remote endpoint, or a model that the
judged text can steer), so a verdict counts only in its declared form; anything else is `JudgeBadOutput`, which
fails that one sample with the reason, never a silently wrong score.

    probability(x)              P(Yes) from a backend: a real number (not a bool), finite, in [0, 1]
    parse_label(text)           1.0 / 0.0 for an answer that is exactly Yes / No (case, quotes, markup and end
                                punctuation aside); `label_of` gives None instead of raising
    parse_score(text, max)      the verdict line is one plain decimal in [0, max] (no sign, no exponent, ASCII
                                digits), optionally "score:" before it and "/max" after it
    parse_ranking(text, n)      the verdict line is a best-first order: candidate numbers 1..n, each exactly once,
                                separated by '>', ',' or spaces, optionally "[k]" and a "ranking:" label

The verdict line is the first non-blank line (what follows may explain it). Parsers look at a bounded prefix
(`MAX_VERDICT_CHARS`), use anchored regexes over that prefix only, and raise nothing but JudgeBadOutput.
"""

from __future__ import annotations

import math
import numbers
import re
from typing import Any

from posttrain.rewards.judges.errors import JudgeBadOutput

MAX_VERDICT_CHARS = 256  # a verdict line; anything longer is not a verdict
_WRAP = "\"'`*_ \t"  # quotes and markdown emphasis around a verdict
_LABEL_WRAP = _WRAP + "()[].,:;!?"

# A plain decimal: at most 12 digits each side, so float() of it is always finite and exact enough.
_DECIMAL = r"[0-9]{1,12}(?:\.[0-9]{1,12})?"
_SCORE = re.compile(
    rf"(?:(?:score|rating|grade)\s*[:=]?[\s*_]*)?({_DECIMAL})(?:\s*/\s*({_DECIMAL}))?\.?", re.IGNORECASE
)
_ITEM = r"\[?[1-9][0-9]{0,2}\]?"
_RANKING = re.compile(
    rf"(?:(?:ranking|order|answer)\s*:[\s*_]*)?({_ITEM}(?:\s*[>,]\s*{_ITEM}|\s+{_ITEM})*)\.?", re.IGNORECASE
)


def _shown(text: Any) -> str:
    """The start of an answer, for an error message (repr: control characters and quotes stay visible)."""
    return repr(text[:80]) if isinstance(text, str) else type(text).__name__


def _text(text: Any, what: str) -> str:
    if not isinstance(text, str):
        raise JudgeBadOutput(f"expected the judge's {what} as text, got {type(text).__name__}")
    return text


def verdict_line(text: Any, what: str) -> str:
    """The first non-blank line of an answer, stripped of quotes and markup around it."""
    head = _text(text, what).lstrip()[: MAX_VERDICT_CHARS + 1]
    line = head.splitlines()[0] if head else ""
    if len(line) > MAX_VERDICT_CHARS:
        raise JudgeBadOutput(f"the judge's {what} line is over {MAX_VERDICT_CHARS} characters: {_shown(line)}")
    return line.strip(_WRAP)


def probability(x: Any) -> float:
    """P(Yes) as a backend gave it, checked: a finite real number in [0, 1]."""
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise JudgeBadOutput(f"expected P(Yes) as a number, the backend gave {type(x).__name__} {_shown(x)}")
    try:
        v = float(x)
    except (OverflowError, ValueError):
        v = math.nan
    if not (math.isfinite(v) and 0.0 <= v <= 1.0):
        raise JudgeBadOutput(f"P(Yes) {v!r} is not a finite number in [0, 1]")
    return v


def label_of(text: Any) -> float | None:
    """1.0 / 0.0 when the whole answer is Yes / No, else None."""
    if not isinstance(text, str) or len(text) > MAX_VERDICT_CHARS:
        return None
    return {"yes": 1.0, "no": 0.0}.get(text.strip().strip(_LABEL_WRAP).lower())


def parse_label(text: Any) -> float:
    v = label_of(text)
    if v is None:
        raise JudgeBadOutput(f"expected Yes or No, the judge answered {_shown(text)}")
    return v


def parse_score(text: Any, max_score: float) -> float:
    """A score from 0 to `max_score`, divided by `max_score`."""
    line = verdict_line(text, "score")
    m = _SCORE.fullmatch(line)
    if m is None:
        raise JudgeBadOutput(
            f"expected a score from 0 to {max_score:g} (like '7' or 'score: 7/{max_score:g}'), "
            f"the judge answered {_shown(text)}"
        )
    v = float(m.group(1))
    if m.group(2) is not None and float(m.group(2)) != max_score:
        raise JudgeBadOutput(f"score {line!r} is not out of {max_score:g}")
    if not 0.0 <= v <= max_score:
        raise JudgeBadOutput(f"score {v:g} outside [0, {max_score:g}] in {_shown(text)}")
    return v / max_score


def parse_ranking(text: Any, n: int) -> list[int]:
    """0-based candidate indices, best first."""
    m = _RANKING.fullmatch(verdict_line(text, "ranking"))
    nums = [int(x) for x in re.findall(r"[0-9]+", m.group(1))] if m else []
    if sorted(nums) != list(range(1, n + 1)):
        raise JudgeBadOutput(
            f"expected a ranking of the candidates 1..{n}, each once, best first (like "
            f"'2 > 1'), the judge answered {_shown(text)}"
        )
    return [x - 1 for x in nums]
