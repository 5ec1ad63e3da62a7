"""Reasoning parsers by model family, in a name registry (`REASONING_PARSERS`), and the family read from a chat
template: a reply split into its reasoning (the `reasoning_content` of a chat message, vLLM's and DeepSeek's name)
and its content.

    think     <think>...</think>     Qwen3, QwQ, DeepSeek-R1 and its distills, SmolLM3
    mistral   [THINK]...[/THINK]     Magistral
    none      the whole reply is content

Where the block starts: at the start of the reply, or already open in the prompt. DeepSeek-R1's template ends the
generation prompt with `<think>\\n`, so its completion starts inside the block and only ends it; `prompt_tail` (the
end of the rendered prompt) says so. A reply whose block never ends (it ran out of tokens) is all reasoning; an end
marker with no start (a template that opened the block some other way) ends reasoning that began with the reply, as
vLLM reads it. A start marker later in the reply is text: reasoning comes first. Linear (two str.find).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ReasoningFormat:
    name: str
    start: str = ""  # "" : no reasoning
    end: str = ""

    @property
    def markers(self) -> tuple[str, ...]:
        return (self.start, self.end) if self.start else ()

    def split(self, text: str, prompt_tail: str = "") -> tuple[str | None, str]:
        """(the reasoning, None when the reply has none; the content)."""
        if not self.start:
            return None, text
        body = text.lstrip()
        opened = body.startswith(self.start)
        if opened:
            body = body[len(self.start) :]
        else:
            body, opened = text, prompt_tail.rstrip().endswith(self.start)
        end = body.find(self.end)
        if end < 0:
            return (body.strip() or None, "") if opened else (None, text)
        return body[:end].strip() or None, body[end + len(self.end) :].strip()


REASONING_PARSERS: dict[str, ReasoningFormat] = {
    "think": ReasoningFormat("think", "<think>", "</think>"),
    "mistral": ReasoningFormat("mistral", "[THINK]", "[/THINK]"),
    "none": ReasoningFormat("none"),
}


def detect_reasoning_parser(template: str) -> str:
    """The reasoning parser a chat template's text asks for: its family's block markers, else none."""
    if "[THINK]" in template:
        return "mistral"
    return "think" if "<think>" in template or "</think>" in template else "none"
