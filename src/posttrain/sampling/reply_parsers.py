"""A completion read as an assistant message: its reasoning, content and tool calls, with the formats of the model's
family (tool_parsers.py, reasoning_parsers.py), chosen from the tokenizer's chat template or named.

    parsers = ReplyParsers(tokenizer, tool="auto", reasoning="auto")     once per tokenizer
    parsers.parse(completion, prompt_ids, tools=True, schemas=...)       -> ParsedMessage

Used by the OpenAI-compatible server's chat replies (openai_chat.py) and by the tool env (envs/tool_env.py).

Markers that are special tokens: the samplers decode with special tokens skipped, so where a tokenizer holds a
format's marker as one (`[TOOL_CALLS]`, `[ARGS]` in Mistral's, `<think>` in some), the completion's text has lost
it. It is put back where its token sits: the text before it is the decode of the ids before it, checked to be
what the completion's text has there (a marker past the text's stop-string cut stays out). One decode per marker,
at most MAX_MARKERS of them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from posttrain.errors import PosttrainError
from posttrain.sampling.reasoning_parsers import REASONING_PARSERS, ReasoningFormat, detect_reasoning_parser
from posttrain.sampling.tool_calls import MAX_CALLS, Schemas
from posttrain.sampling.tool_parsers import TOOL_PARSERS, ToolFormat, detect_tool_parser
from posttrain.types import Completion

MAX_MARKERS = 2 * MAX_CALLS + 8  # marker tokens put back into one reply
PROMPT_TAIL_TOKENS = 8  # enough for "<｜Assistant｜><think>\n"


class UnknownParser(PosttrainError, ValueError):
    fix = "name one of them, or auto (the chat template's family)"


@dataclass(frozen=True)
class ParsedMessage:
    reasoning: str | None
    content: str
    calls: list[dict[str, Any]] = field(default_factory=list)  # {"name": str, "arguments": dict}
    errors: list[str] = field(default_factory=list)


def template_text(tokenizer: Any) -> str:
    """Every chat template a tokenizer holds, as one text (a tokenizer may keep several, named)."""
    t = getattr(tokenizer, "chat_template", None)
    if isinstance(t, Mapping):
        return "\n".join(v for v in t.values() if isinstance(v, str))
    if isinstance(t, list):  # [{"name", "template"}], an older way of keeping several
        return "\n".join(x.get("template", "") for x in t if isinstance(x, dict) and isinstance(x.get("template"), str))
    return t if isinstance(t, str) else ""


def _pick(kind: str, choice: str, names: Mapping[str, Any], detected: str) -> str:
    if choice == "auto":
        return detected
    if choice not in names:
        raise UnknownParser(f"unknown {kind} parser {choice!r}; known: auto, {', '.join(names)}")
    return choice


def check_parser_names(tool: str, reasoning: str) -> None:
    """Raise UnknownParser for a name neither registry holds (auto is always known)."""
    _pick("tool", tool, TOOL_PARSERS, "auto")
    _pick("reasoning", reasoning, REASONING_PARSERS, "auto")


def skipped_markers(tokenizer: Any, markers: Sequence[str]) -> dict[int, str]:
    """{token id: marker} for the markers the tokenizer holds as tokens that a decode skipping special tokens drops."""
    try:
        added = tokenizer.get_added_vocab()
        return {
            added[m]: m for m in markers if m in added and tokenizer.decode([added[m]], skip_special_tokens=True) == ""
        }
    except Exception:  # noqa: BLE001 - a tokenizer without added tokens to read: nothing to put back
        return {}


def restore_markers(tokenizer: Any, ids: Sequence[int], text: str, markers: Mapping[int, str]) -> str:
    """`text` (the decode of `ids` with special tokens skipped, maybe cut at a stop string) with each marker token of
    `ids` put back where it sits (see the module doc)."""
    at = [k for k, i in enumerate(ids) if i in markers][:MAX_MARKERS] if markers else []
    if not at:
        return text
    out: list[str] = []
    pos, cut = 0, None  # cut: whether the text ends before the ids do (a stop string), read once when needed
    for k in at:
        before = tokenizer.decode(list(ids[:k]), skip_special_tokens=True)
        n = len(before)
        if n == len(text) and cut is None:
            cut = len(tokenizer.decode(list(ids), skip_special_tokens=True)) > len(text)
        if n < pos or n > len(text) or (n == len(text) and cut) or text[pos:n] != before[pos:n]:
            continue  # past the stop cut, or a decode that does not line up with the text: leave it out
        out += [text[pos:n], markers[ids[k]]]
        pos = n
    out.append(text[pos:])
    return "".join(out)


def tool_schemas(tools: Sequence[Any] | None) -> dict[str, Any]:
    """{name: parameters} of OpenAI function tools (`{"type": "function", "function": {...}}` or the flat form)."""
    out: dict[str, Any] = {}
    for t in tools or []:
        fn = t.get("function", t) if isinstance(t, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str) and isinstance(fn.get("parameters"), dict):
            out[fn["name"]] = fn["parameters"]
    return out


class ReplyParsers:
    """The tool-call and reasoning formats of one tokenizer's model: `tool` and `reasoning` name a parser, or
    auto (the chat template's family)."""

    def __init__(self, tokenizer: Any, tool: str = "auto", reasoning: str = "auto"):
        template = template_text(tokenizer)
        self.tok = tokenizer
        self.tool: ToolFormat = TOOL_PARSERS[_pick("tool", tool, TOOL_PARSERS, detect_tool_parser(template))]
        self.reasoning: ReasoningFormat = REASONING_PARSERS[
            _pick("reasoning", reasoning, REASONING_PARSERS, detect_reasoning_parser(template))
        ]
        self._tool_markers = skipped_markers(tokenizer, self.tool.markers)
        self._reasoning_markers = skipped_markers(tokenizer, self.reasoning.markers)

    def split(self, c: Completion, prompt_ids: Sequence[int], tools: bool = True) -> tuple[str | None, str]:
        """(reasoning, content) of a completion, the formats' markers put back (the tool format's only with `tools`)."""
        markers = {**self._reasoning_markers, **(self._tool_markers if tools else {})}
        text = restore_markers(self.tok, c.token_ids, c.text, markers)
        if not self.reasoning.start:
            return None, text
        tail = self.tok.decode(list(prompt_ids[-PROMPT_TAIL_TOKENS:]), skip_special_tokens=False) if prompt_ids else ""
        return self.reasoning.split(text, tail)

    def parse(
        self, c: Completion, prompt_ids: Sequence[int], tools: bool = True, schemas: Schemas | None = None
    ) -> ParsedMessage:
        """The completion as a message; tool calls read only with `tools`, never from the reasoning."""
        reasoning, content = self.split(c, prompt_ids, tools)
        if not tools:
            return ParsedMessage(reasoning, content)
        content, calls, errors = self.tool.parse(content, schemas)
        return ParsedMessage(reasoning, content, calls, errors)
