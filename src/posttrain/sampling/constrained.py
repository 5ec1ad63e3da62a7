"""Grammar-constrained decoding for the own sampler (hf_sampler.py), with llguidance: a `Constraint` (types.py)
checked and compiled within bounds, one matcher per row of a decode call, each decode step's logits masked to the
tokens the grammar allows.

    json_constraint(schema)         response_format json_schema (a schema) / json_object (None: any JSON object)
    lark_constraint(grammar)        a Lark grammar in llguidance's syntax (the rest of a forced tool call)
    check_constraint(c)             the bounds, then the grammar compiled without a tokenizer: ConstraintError
    tool_call_grammar(family, ...)  what follows a forced tool-call opening (tool_parsers.forced_opening)
    Constrainer                     per sampler: the llguidance tokenizer (built once), `rows(c, B)` per call
    RowMatchers                     per decode call: `mask(logits, rows)` before a token is chosen, `advance` after
    vllm_structured(c)              the same constraint as vLLM's structured outputs (vllm_engine.py, vLLM servers)

What is trained: a constrained row's sampled tokens and, as its behaviour log-probs, the log-probs of the
distribution it was actually sampled from (the logits with every disallowed token at -inf, renormalised). The
trainer's own log-probs are of the unmasked policy, so the gap between the two is the constraint's doing, and the
off-policy corrections (algos/off_policy.py) see it as they see any other sampler mismatch.

Bounds (a schema is request input, hostile): MAX_SCHEMA_CHARS of JSON text, MAX_SCHEMA_DEPTH levels, every
`pattern` through bounded_regex.check_pattern, and llguidance's own fuel limits (LIMITS) for compiling and for each
mask. A matcher that still fails mid-decode (its fuel ran out) allows only the stop tokens: that row ends, alone.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

import torch

from posttrain.bounded import BoundedError, json_depth_ok
from posttrain.bounded_regex import check_pattern
from posttrain.errors import PosttrainError
from posttrain.sampling.tool_parsers import CALL_PARTS
from posttrain.types import Constraint

log = logging.getLogger(__name__)

MAX_SCHEMA_CHARS = 64 * 1024  # of a schema's JSON text (a tool call's grammar: of every tool's together)
MAX_SCHEMA_DEPTH = 32  # nested objects / arrays in a schema's JSON text
MAX_PATTERNS = 256  # `pattern` / `patternProperties` regexes in one schema, each checked by check_pattern
# llguidance's own bounds (its defaults, lowered where a request could spend them): fuel for building the lexer,
# per-mask fuel and Earley items (each about a millisecond per 10-50k), grammar size, lexer states (~1-2 kB each).
LIMITS: dict[str, Any] = {
    "initial_lexer_fuel": 1_000_000,
    "step_lexer_fuel": 200_000,
    "step_max_items": 50_000,
    "max_grammar_size": 200_000,
    "max_lexer_states": 50_000,
    "verbose_errors": False,  # an error names the fault, not the grammar (it is request input, echoed back)
}


# JSON as json.dumps writes it (", " and ": ", no other whitespace) unless the schema's own "x-guidance" says
# otherwise: flexible whitespace let a small model spend its max_tokens on blank lines inside the object.
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class ConstraintError(PosttrainError, ValueError):
    """A response format the server cannot decode to: too large, too deep, an unsafe pattern, or not a schema
    llguidance compiles. A ValueError, so the server answers 400."""

    fix = "send a smaller, valid JSON schema (JSON Schema draft 2020-12 keywords llguidance supports)"


def _llg():
    import llguidance  # the `serve` extra: imported where a constraint is used, not with the sampler

    return llguidance


def _limits():
    return _llg().LLParserLimits(**LIMITS)


def json_constraint(schema: Any | None) -> Constraint:
    """A JSON-schema constraint (None: any JSON object, response_format json_object), its bounds checked."""
    if schema is None:
        schema = {"type": "object"}
    if not isinstance(schema, dict | bool):
        raise ConstraintError(f"a JSON schema must be an object, got {type(schema).__name__}")
    if isinstance(schema, dict):
        style = schema.get("x-guidance")
        schema = {**schema, "x-guidance": {**JSON_STYLE, **(style if isinstance(style, dict) else {})}}
    text = json.dumps(schema, separators=(",", ":"))
    _check_text(text, "JSON schema")
    _check_patterns(schema)
    return Constraint("json_schema", text)


def lark_constraint(grammar: str) -> Constraint:
    return Constraint("lark", grammar)


def _check_text(text: str, what: str) -> None:
    if len(text) > MAX_SCHEMA_CHARS:
        raise ConstraintError(f"the {what} has {len(text)} characters; this server takes at most {MAX_SCHEMA_CHARS}")
    try:
        json_depth_ok(text, max_depth=MAX_SCHEMA_DEPTH)
    except BoundedError as e:
        raise ConstraintError(f"the {what} is too deep: {e}") from None


def _check_patterns(schema: Any) -> None:
    """Every regex of a schema (`pattern`, `patternProperties` keys) through check_pattern; walked without
    recursion (the depth is already bounded, the width by the text's size)."""
    stack, seen = [schema], 0
    while stack:
        v = stack.pop()
        if isinstance(v, list):
            stack.extend(v)
            continue
        if not isinstance(v, dict):
            continue
        found = [v["pattern"]] if isinstance(v.get("pattern"), str) else []
        if isinstance(v.get("patternProperties"), dict):
            found += list(v["patternProperties"])
        for p in found:
            seen += 1
            if seen > MAX_PATTERNS:
                raise ConstraintError(f"the JSON schema has more than {MAX_PATTERNS} patterns")
            try:
                check_pattern(p)
            except BoundedError as e:
                raise ConstraintError(f"a pattern of the JSON schema is refused: {e}") from None
        stack.extend(v.values())


def grammar_of(c: Constraint) -> str:
    """llguidance's grammar text for a constraint."""
    llg = _llg()
    if c.kind == "json_schema":
        try:
            return llg.LLMatcher.grammar_from_json_schema(c.spec)
        except ValueError as e:
            raise ConstraintError(f"not a JSON schema: {e}") from None
    if c.kind == "lark":
        return llg.LLMatcher.grammar_from_lark(c.spec)
    raise ConstraintError(f"unknown constraint kind {c.kind!r}: json_schema or lark")


def check_constraint(c: Constraint) -> None:
    """Compile the grammar without a tokenizer under LIMITS (ConstraintError with llguidance's reason). What a
    server runs before it samples, so a bad schema is a 400 whichever sampler serves."""
    if c.kind == "json_schema":
        _check_text(c.spec, "JSON schema")
    elif len(c.spec) > 4 * MAX_SCHEMA_CHARS:
        raise ConstraintError(f"the grammar has more than {4 * MAX_SCHEMA_CHARS} characters")
    failed, messages = _llg().LLMatcher.validate_grammar_with_warnings(grammar_of(c), None, limits=_limits())
    if failed:
        raise ConstraintError(f"the response format cannot be decoded to: {_short(messages)}")


def _short(messages: list[str]) -> str:
    return "; ".join(messages)[:500] or "llguidance refused it"


def _lit(text: str) -> str:
    return json.dumps(text)  # a Lark string literal: JSON's escapes


def tool_call_grammar(family: str, schemas: dict[str, Any], name: str | None) -> Constraint | None:
    """What follows the forced opening of a call in `family`'s format (tool_parsers.forced_opening): the function's
    name (one of `schemas`', unless `name` was forced) and its arguments as JSON of its parameters' schema, then the
    call's close. None: the family's calls are not JSON-shaped (mistral, qwen3_coder: the opening alone is forced).
    A tool whose schema is too large or does not compile is held to any JSON object instead."""
    parts = CALL_PARTS.get(family)
    if parts is None or not schemas:
        return None
    _, mid, end = parts
    names = [name] if name is not None else list(schemas)
    rules, branches = [], []
    for i, n in enumerate(names):
        schema = schemas.get(n)
        try:
            text = json_constraint(schema if isinstance(schema, dict) else None).spec
            check_constraint(Constraint("json_schema", text))
        except ConstraintError:
            text = '{"type":"object"}'
        head = "" if name is not None else _lit(json.dumps(n)[1:-1] + mid) + " "
        branches.append(f"{head}args{i}")
        rules.append(f"args{i}: %json {text}")
    grammar = "start: (" + " | ".join(branches) + ") " + _lit(end) + "\n" + "\n".join(rules) + "\n"
    c = lark_constraint(grammar)
    try:
        check_constraint(c)
    except ConstraintError as e:
        log.warning("tool call grammar refused, the call's opening alone is forced: %s", e)
        return None
    return c


def vllm_structured(c: Constraint) -> dict[str, Any]:
    """vLLM's structured outputs (`StructuredOutputsParams` fields; the same dict in a /generate body) for a
    constraint. vLLM masks the logits before its sampler too, so its returned log-probs are of the masked
    distribution, as the own sampler's are. A Lark grammar with `%json` is llguidance's: vLLM's "auto" backend
    falls back to guidance for it."""
    if c.kind == "json_schema":
        return {"json": json.loads(c.spec), "disable_any_whitespace": True}
    if c.kind == "lark":
        return {"grammar": c.spec}
    raise ConstraintError(f"unknown constraint kind {c.kind!r}: json_schema or lark")


@dataclass
class Constrainer:
    """Per sampler: the tokenizer as llguidance reads it, built on the first constrained call (about a second)."""

    tokenizer: Any
    stop_token_ids: list[int]
    _llg_tok: Any = None

    def rows(self, c: Constraint | None, batch: int, vocab: int) -> RowMatchers | None:
        """One matcher per row for a decode call of `batch` rows (None: unconstrained)."""
        if c is None:
            return None
        if self._llg_tok is None:
            self._llg_tok = _llg_tokenizer(self.tokenizer, max(vocab, len(self.tokenizer)), self.stop_token_ids)
        first = _llg().LLMatcher(self._llg_tok, grammar_of(c), log_level=0, limits=_limits())
        if first.is_error():
            raise ConstraintError(f"the response format cannot be decoded to: {first.get_error()[:500]}")
        matchers = [first] + [first.deep_copy() for _ in range(batch - 1)]
        return RowMatchers(matchers, self.stop_token_ids, (self._llg_tok.vocab_size + 31) // 32)


def _llg_tokenizer(tokenizer: Any, n_vocab: int, stop_ids: list[int]) -> Any:
    """llguidance's tokenizer: from the fast tokenizer's JSON, or for one llguidance cannot read (a decoder it does
    not know, as the tiny test tokenizer's) from each token's text."""
    llg = _llg()
    import llguidance.hf

    try:
        return llguidance.hf.from_tokenizer(tokenizer, n_vocab=n_vocab, eos_token=stop_ids)
    except (ValueError, TypeError) as e:
        log.info("llguidance reads the tokenizer token by token (%s)", e)
    from llguidance._tokenizer import (
        TokenizerWrapper,  # llguidance's generic adapter (its hf.py is for Rust-readable tokenizers)
    )

    return llg.LLTokenizer(TokenizerWrapper(_TokenList(tokenizer)), n_vocab=n_vocab, eos_token=stop_ids)


class _TokenList:
    """What llguidance's TokenizerWrapper reads: each token's bytes, the special ids, and encoding a string."""

    def __init__(self, tokenizer: Any):
        self.tok = tokenizer
        self.eos_token_id = tokenizer.eos_token_id
        self.bos_token_id = tokenizer.bos_token_id
        self.tokens = [tokenizer.decode([i]).encode() for i in range(len(tokenizer))]
        self.special_token_ids = list(tokenizer.all_special_ids)

    def __call__(self, text: str | bytes) -> list[int]:
        s = text.decode(errors="replace") if isinstance(text, bytes) else text
        return [int(i) for i in self.tok(s, add_special_tokens=False)["input_ids"]]


_BITS = torch.arange(32, dtype=torch.int32)


class RowMatchers:
    """The matchers of one decode call, indexed by output row (hf_sampler's `rows` maps batch rows to them)."""

    def __init__(self, matchers: list[Any], stop_ids: list[int], words: int):
        self.matchers = matchers
        self.stop_ids = stop_ids
        self.words = words  # 32-bit words of a row's bitmask

    def mask(self, logits_bV: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """The logits with every token the row's grammar does not allow next at -inf (a new tensor)."""
        bitmask = torch.full((len(rows), self.words), -1, dtype=torch.int32)
        failed = []
        for b, r in enumerate(rows.tolist()):
            m = self.matchers[r]
            if m.is_error():
                failed.append(b)
            elif not m.is_stopped():  # a stopped row is finished: its token is dropped, any mask does
                v = bitmask[b]
                m.unsafe_compute_mask_ptr(v.data_ptr(), v.numel() * v.element_size())
                failed += [b] if m.is_error() else []
        allowed = ((bitmask[:, :, None] >> _BITS) & 1).reshape(len(rows), -1).bool()
        failed += [b for b in (~allowed.any(1)).nonzero().flatten().tolist() if b not in failed]  # never no token
        for b in failed:  # fuel ran out mid-decode (or a bug): only the stop tokens, so this row ends alone
            log.warning("a constrained row's matcher failed: %s", self.matchers[int(rows[b])].get_error()[:200])
            allowed[b] = False
            allowed[b, [s for s in self.stop_ids if s < allowed.shape[1]]] = True
        V = logits_bV.shape[-1]
        if allowed.shape[1] < V:
            allowed = torch.cat([allowed, allowed.new_zeros(len(rows), V - allowed.shape[1])], 1)
        return logits_bV.masked_fill(~allowed[:, :V].to(logits_bV.device), float("-inf"))

    def advance(self, tok_b: torch.Tensor, rows: torch.Tensor, live_b: torch.Tensor) -> torch.Tensor:
        """Each live row's matcher takes its token; True for the rows whose grammar has now stopped."""
        stopped = []
        for r, tok, live in zip(rows.tolist(), tok_b.tolist(), live_b.tolist()):
            m = self.matchers[r]
            if live and not m.is_error() and not m.is_stopped():
                m.consume_token(tok)
            stopped.append(bool(live) and m.is_stopped())
        return torch.tensor(stopped, dtype=torch.bool, device=tok_b.device)
