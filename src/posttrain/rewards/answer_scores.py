"""The named rewards' pure scoring functions (rewards/named.py's NAMED_REWARDS), one per reward but math (whose
checker runs in a worker process, named.py's MathReward): exact, contains, numeric (with `parse_number`), choice
(with `choice_letter`), regex, json_schema (with `json_text`), format and length.

Each is `(completion text, the row's columns it reads, options, prepared state) -> score`: it reads the answer through
rewards/extract.py, raises GoldError for a row whose gold answer it cannot use (the data's fault: that sample fails)
and CountedScore for a score to count under a key (a regex timeout). Apart from named.py so the scoring reads on its
own, without the registry and the reward classes; it imports the options (config/reward_options.py) and the error
(rewards/named_options.py), never named.py. named.py builds its rewards from these scorers, `gold_answer` (a row's
gold answer, GoldError when empty) and `compile_regex` (a regex reward's prepared state).
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Any

from posttrain.bounded import BoundedError, loads_json
from posttrain.config.reward_options import (
    ChoiceOptions,
    ContainsOptions,
    ExactOptions,
    FormatOptions,
    JsonSchemaOptions,
    LengthOptions,
    NumericOptions,
    RegexOptions,
    schema_validator,
)
from posttrain.rewards.extract import extract_answer, has_answer, last_match
from posttrain.rewards.named_options import RewardConfigError


class GoldError(ValueError):
    """A row whose gold answer the reward cannot use (the data's fault, not the model's): that sample fails."""


class CountedScore(Exception):
    """A scorer's way to say "this score, and count it under `key`" (a regex timeout)."""

    def __init__(self, key: str, value: float):
        super().__init__(key)
        self.key, self.value = key, value


# ------------------------------------------------------------------------------------------------ pure scoring

# Each scorer: (completion text, the row's columns it reads, options, prepared state) -> a score. Pure: the state is
# built once from the options (a compiled pattern, a schema validator) and never changed.


def gold_answer(row: dict[str, Any], column: str) -> Any:
    gold = row.get(column)
    if gold is None or (isinstance(gold, str) and not gold.strip()):
        raise GoldError(f"the row's {column!r} is empty: no gold answer to compare with")
    return gold


def _norm(s: str, o: ExactOptions | ContainsOptions) -> str:
    if isinstance(o, ContainsOptions) or o.strip:  # contains: always stripped
        s = s.strip()
    if isinstance(o, ContainsOptions) or o.normalize_whitespace:
        s = " ".join(s.split())
    return s.casefold() if o.case_insensitive else s


def score_exact(text: str, row: dict[str, Any], o: ExactOptions, state: Any = None) -> float:
    """1.0 when the extracted answer equals the gold column's text (after strip / whitespace / case options)."""
    gold = str(gold_answer(row, o.answer_column))
    answer = extract_answer(text, o.answer_format)
    return float(answer is not None and _norm(answer, o) == _norm(gold, o))


def score_contains(text: str, row: dict[str, Any], o: ContainsOptions, state: Any = None) -> float:
    """1.0 when the gold column's text appears in the extracted answer (answer_format: none searches the whole
    completion)."""
    gold = _norm(str(gold_answer(row, o.answer_column)), o)
    answer = extract_answer(text, o.answer_format)
    return float(answer is not None and gold in _norm(answer, o))


_NUM = r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?(?:[eE][-+]?\d{1,3})?|[-+]?\.\d+(?:[eE][-+]?\d{1,3})?"
_WHOLE_NUMBER = re.compile(rf"({_NUM})(?:/({_NUM}))?(%)?")
_ANY_NUMBER = re.compile(rf"({_NUM})(?:\s*/\s*({_NUM}))?(\s*%)?")
_FRAC = re.compile(r"\\[dt]?frac\{([^{}]{1,40})\}\{([^{}]{1,40})\}")
_TEX_NOISE = re.compile(r"\\[,!;: ]|\\text\{\s*\}|\\left|\\right|\{,\}|\\\$|\$")
MAX_NUMBER_CHARS = 100  # digits past this are no answer anyone writes; float() on them is wasted work


def _value(num: str) -> Fraction | None:
    if len(num) > MAX_NUMBER_CHARS:
        return None
    try:
        f = float(num.replace(",", ""))
    except ValueError:
        return None
    return Fraction(f) if math.isfinite(f) else None


def _readings(m: re.Match[str]) -> list[float]:
    """The values a matched number may mean: a percent reads as both x/100 and x ("50%" is 0.5 or "50 percent")."""
    num, den = _value(m.group(1)), _value(m.group(2)) if m.group(2) else Fraction(1)
    if num is None or not den:
        return []
    v = float(num / den)
    return [v / 100, v] if m.group(3) else [v]


def parse_number(text: str) -> list[float]:
    """The readings of the number `text` states: what follows its last "=" if it has one ("3 + 4 = 7" -> 7), as one
    number if it is one ("1,234", "-3/4", "\\frac{3}{4}", "$5", "50\\%"), else the only number among words ("x is 12
    cm" -> 12). Empty when there is none or several ("10**10**10": an expression, not a number); never a non-finite
    value."""
    s = _FRAC.sub(r"\1/\2", text.replace("\\%", "%"))
    s = _TEX_NOISE.sub("", s).rsplit("=", 1)[-1].strip().rstrip(".")
    whole = _WHOLE_NUMBER.fullmatch(s.replace(" ", ""))
    if whole:
        return _readings(whole)
    found = []
    for m in _ANY_NUMBER.finditer(s):
        found.append(m)
        if len(found) > 1:
            return []
    return _readings(found[0]) if found else []


def score_numeric(text: str, row: dict[str, Any], o: NumericOptions, state: Any = None) -> float:
    """1.0 when the number in the extracted answer is within abs_tol / rel_tol of the gold number."""
    raw = gold_answer(row, o.answer_column)
    golds = [float(raw)] if isinstance(raw, (int, float)) and not isinstance(raw, bool) else parse_number(str(raw))
    golds = [g for g in golds if math.isfinite(g)]
    if not golds:
        raise GoldError(f"the row's {o.answer_column!r} ({str(raw)[:40]!r}) is not a number")
    answer = extract_answer(text, o.answer_format)
    got = parse_number(answer) if answer is not None else []
    return float(any(math.isclose(a, g, rel_tol=o.rel_tol, abs_tol=o.abs_tol) for a in got for g in golds))


def _choice_patterns(letters: str) -> list[re.Pattern[str]]:
    """Most explicit first. No two unbounded runs of the same characters sit side by side (linear on any text)."""
    L = f"([{re.escape(letters)}])"
    return [
        re.compile(rf"(?i:answer)(?:\s+(?i:is))?\s*(?:[:\-]\s*)?[(\[*]*{L}(?![A-Za-z])"),  # The answer is (C)
        re.compile(rf"\\boxed\{{{L}\}}"),  # \boxed{C}
        re.compile(rf"\*\*\(?{L}\)?\*\*"),  # **C** / **(C)**
        re.compile(rf"\({L}\)"),  # (C)
        re.compile(rf"(?:^|\s){L}[).:](?!\S)"),  # C) / C. / C: standing alone
        re.compile(rf"\W*{L}\W*"),
    ]  # the whole answer is the letter (fullmatch)


def choice_letter(text: str, letters: str = "ABCDEFGHIJ") -> str | None:
    """The option letter `text` picks, or None: "The answer is (C)", "Answer: C", "**C**", "(C)", "C)", "C"."""
    *found_in, whole = _choice_patterns(letters)
    for pattern in found_in:
        last = last_match(pattern, text)
        if last:
            return last.group(1)
    m = whole.fullmatch(text)
    return m.group(1) if m else None


def _gold_letter(raw: Any, o: ChoiceOptions) -> str:
    if isinstance(raw, int) and not isinstance(raw, bool) and 0 <= raw < len(o.letters):
        return o.letters[raw]
    s = str(raw).strip().strip("()").strip().upper()
    if len(s) != 1 or s not in o.letters:
        raise GoldError(
            f"the row's {o.answer_column!r} ({str(raw)[:40]!r}) is not one of the letters "
            f"{o.letters} or an index 0-{len(o.letters) - 1}"
        )
    return s


def score_choice(text: str, row: dict[str, Any], o: ChoiceOptions, state: Any = None) -> float:
    """1.0 when the option letter picked in the extracted answer is the gold letter (or gold index)."""
    gold = _gold_letter(gold_answer(row, o.answer_column), o)
    answer = extract_answer(text, o.answer_format)
    return float(answer is not None and choice_letter(answer, o.letters) == gold)


def compile_regex(o: RegexOptions) -> Any:
    import regex

    try:
        return regex.compile(o.pattern, regex.IGNORECASE if o.ignore_case else 0)
    except regex.error as e:
        raise RewardConfigError(f"pattern {o.pattern!r} is not a valid regular expression: {e}") from None


def score_regex(text: str, row: dict[str, Any], o: RegexOptions, rx: Any) -> float:
    """1.0 when the extracted answer matches `pattern` (anywhere, or whole with fullmatch); the text is cut to
    max_chars and a match past timeout_s scores 0."""
    answer = extract_answer(text, o.answer_format)
    if answer is None:
        return 0.0
    match = rx.fullmatch if o.fullmatch else rx.search
    try:
        return float(match(answer[: o.max_chars], timeout=o.timeout_s) is not None)
    except TimeoutError:
        raise CountedScore("timeouts", 0.0) from None


def json_text(text: str, how: str) -> str | None:
    """The JSON part of a completion. auto: <answer> tags, else the last ``` fenced block, else the whole text."""
    if how != "auto":
        return extract_answer(text, how)
    tagged = extract_answer(text, "answer_tag")
    if tagged is not None:
        return tagged
    close = text.rfind("```")
    start = text.rfind("```", 0, close) if close > 0 else -1
    if start >= 0:
        body = text[start + 3 : close]
        first, nl, rest = body.partition("\n")
        return rest if nl and first.strip().isalnum() else body  # ```json\n{...}``` drops the language tag
    return text


def score_json_schema(text: str, row: dict[str, Any], o: JsonSchemaOptions, validator: Any) -> float:
    """1.0 when the answer parses as JSON (bounded: size, depth, no NaN) and validates against the schema."""
    if o.schema_column:
        schema = gold_answer(row, o.schema_column)
        if isinstance(schema, str):
            try:
                schema = loads_json(schema)
            except BoundedError as e:
                raise GoldError(f"the row's {o.schema_column!r} is not JSON: {e}") from None
        validator = schema_validator(schema, GoldError)
    raw = json_text(text, o.answer_format)
    if raw is None or len(raw) > o.max_chars:
        return 0.0
    try:
        value = loads_json(raw, max_chars=o.max_chars)
    except BoundedError:
        return 0.0
    return float(validator.is_valid(value))


def score_format(text: str, row: dict[str, Any], o: FormatOptions, state: Any = None) -> float:
    """1.0 when the completion gives its answer in the format asked for: answer_tag a closed <answer> tag, boxed a
    closed \\boxed{}, auto either of the two; the other formats need only an answer they can read."""
    return float(has_answer(text, o.answer_format))


def score_length(text: str, row: dict[str, Any], o: LengthOptions, state: Any = None) -> float:
    """1.0 at the target length (at_most: or under it), falling linearly to 0.0 `tolerance` units away."""
    if o.unit == "tokens":
        ids = row.get("completion_ids")
        if ids is None:
            raise GoldError("unit: tokens needs the completion's token ids, which this caller did not pass")
        n = len(ids)
    else:
        n = len(text) if o.unit == "chars" else len(text.split())
    over = max(n - o.target, 0) if o.mode == "at_most" else abs(n - o.target)
    return max(0.0, 1.0 - over / (o.tolerance or o.target))
