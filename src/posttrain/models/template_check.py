"""Chat-template prefix check: does rendering turn k+1 extend the rendering of turn k, token for token?

Multi-turn RL builds each episode incrementally from the sampler's own token ids: turn k+1's prompt is turn k's
prompt + the sampled completion + the environment's tokens. That is only the sequence the model will see at
inference if the chat template renders a longer conversation as an extension of a shorter one. Templates that
rewrite history (drop earlier reasoning, move a system prompt, re-format earlier tool calls) break it, and the
trainer then optimises tokens the model never sees in deployment. TRL, verl and prime-rl users lose runs to this;
we check once per model, before the first rollout, and fail with the first token that differs.
"""

from __future__ import annotations

import re
from typing import Any

from posttrain.errors import PosttrainError


class ChatTemplateError(PosttrainError, ValueError):
    fix = "fix or replace the chat template (tokenizer.chat_template): a longer conversation must extend a shorter one"


PROBE_CONVERSATION: list[dict[str, str]] = [
    {"role": "system", "content": "You can call tools."},
    {"role": "user", "content": "What is the capital of Plethia?"},
    {
        "role": "assistant",
        "content": '<tool_call>{"name": "search", "arguments": {"query": "Plethia capital"}}</tool_call>',
    },
    {"role": "tool", "content": "Zorvan is the capital of Plethia."},
    {"role": "assistant", "content": "The capital is Zorvan."},
    {"role": "user", "content": "Thanks. And its mayor?"},
]


def render_ids(
    tok: Any, messages: list[dict[str, Any]], add_generation_prompt: bool, chat_template: str | None = None
) -> list[int]:
    extra = {"chat_template": chat_template} if chat_template is not None else {}
    out = tok.apply_chat_template(
        messages, add_generation_prompt=add_generation_prompt, tokenize=True, return_dict=False, **extra
    )
    if isinstance(out, dict) or hasattr(out, "keys"):
        out = out["input_ids"]
    return [int(t) for t in out]


_CHECKED: set[tuple[str, str, str]] = set()  # (tokenizer name, its template, tool role) already checked


def check_prefix_property_once(tok: Any, tool_role: str = "tool") -> None:
    """`check_prefix_property` once per tokenizer and template (envs built for every rollout worker share it)."""
    key = (_name(tok), str(getattr(tok, "chat_template", None)), tool_role)
    if key not in _CHECKED:
        check_prefix_property(tok, tool_role=tool_role)
        _CHECKED.add(key)


def _name(tok: Any) -> str:
    return str(getattr(tok, "name_or_path", "") or "this model")


def check_prefix_property(tok: Any, messages: list[dict[str, Any]] | None = None, tool_role: str = "tool") -> None:
    """Raise ChatTemplateError unless, for every k, render(messages[:k+1]) starts with render(messages[:k]).

    Checked both ways an env uses the template: a finished turn (no generation prompt) must be a prefix of the
    next rendering, and so must the generation prompt that precedes an assistant turn.
    """
    if not getattr(tok, "chat_template", None):
        raise ChatTemplateError(f"{_name(tok)} has no chat template: multi-turn envs need one")
    msgs = [dict(m, role=tool_role) if m["role"] == "tool" else m for m in (messages or PROBE_CONVERSATION)]
    for k in range(1, len(msgs)):
        longer = render_ids(tok, msgs[: k + 1], add_generation_prompt=False)
        candidates = [("turn", render_ids(tok, msgs[:k], add_generation_prompt=False))]
        if msgs[k]["role"] == "assistant":
            candidates.append(("generation prompt", render_ids(tok, msgs[:k], add_generation_prompt=True)))
        for what, shorter in candidates:
            if longer[: len(shorter)] != shorter:
                i = next((j for j, (a, b) in enumerate(zip(shorter, longer)) if a != b), min(len(shorter), len(longer)))
                got = repr(tok.decode(longer[i : i + 8])) if i < len(longer) else "<end>"
                raise ChatTemplateError(
                    f"the chat template of {_name(tok)} is not prefix-stable: rendering {k + 1} messages does not "
                    f"extend the rendering of the first {k} ({what}) at token {i}: expected "
                    f"{shorter[i]} {tok.decode(shorter[i : i + 8])!r}..., got {longer[i] if i < len(longer) else None} "
                    f"{got}... (message {k} is {msgs[k]['role']!r}). Multi-turn training would learn from token "
                    f"sequences the model never sees at inference; fix or replace the template "
                    f"(tokenizer.chat_template) before training."
                )


# ---- thinking models --------------------------------------------------------------------------------------------
# A reasoning model's template may drop the reasoning of earlier assistant turns from the history it renders
# (DeepSeek-R1: every turn; Qwen3: the turns before the last user query, and the empty block of a last turn). Two ways
# to train it (Task.thinking; docs/agents.md "Thinking models"):
#   split  every training sequence is a context the model saw when it sampled: where the template drops a turn's
#          reasoning, the next call's prompt is the template's rendering and starts a new chain.
#   keep   a variant of the template that renders every assistant turn's reasoning (`keep_reasoning_template`) is
#          used for sampling and training alike: one chain.
THINKING_MODES = ("split", "keep")


class ThinkingTemplateError(ChatTemplateError):
    fix = (
        "set task.thinking: split (train each context the model saw), or give the tokenizer a chat template that "
        "renders every assistant turn's reasoning (tokenizer.chat_template)"
    )


def thinking_probe(start: str = "<think>", end: str = "</think>", tool_role: str = "tool") -> list[dict[str, Any]]:
    """A conversation with reasoning and tool calls (inline, as the model writes them) over two user queries."""

    def said(reasoning: str, rest: str) -> str:
        return f"{start}\n{reasoning}\n{end}\n\n{rest}"

    call = '<tool_call>\n{"name": "search", "arguments": {"query": "Plethia capital"}}\n</tool_call>'
    return [
        {"role": "system", "content": "You can call tools."},
        {"role": "user", "content": "What is the capital of Plethia?"},
        {"role": "assistant", "content": said("I should look it up.", call)},
        {"role": tool_role, "content": "Zorvan is the capital of Plethia."},
        {"role": "assistant", "content": said("The search says Zorvan.", "The capital is Zorvan.")},
        {"role": "user", "content": "Thanks. And its mayor?"},
        {"role": "assistant", "content": said("I do not know; say so.", "I do not know.")},
    ]


# Known ways a template drops reasoning, and the rewrite that keeps it (as ART's preserve_thinking and TRL's patched
# Qwen3 templates do): Qwen3 renders reasoning only after the last user query and, when empty, only in the last turn;
# DeepSeek-R1 keeps the content after the last '</think>'.
_GATES = (
    (re.compile(r"loop\.index0\s*>\s*ns\.last_query_index"), "true"),
    (re.compile(r"loop\.last\s+or\s+\(\s*not\s+loop\.last\s+and\s+reasoning_content\s*\)"), "true"),
)
_DROP_INLINE = re.compile(
    r"\{%-?\s*set\s+content\s*=\s*content\.split\(\s*['\"]</think>['\"]\s*\)\s*\[\s*-1\s*\]\s*-?%\}"
)


def keep_reasoning_template(template: str) -> str:
    """`template` rewritten to render every assistant turn's reasoning (see `_GATES`); unchanged where no known
    rewrite applies (`check_thinking_template` then says whether it keeps reasoning)."""
    out = template
    for pattern, repl in _GATES:
        out = pattern.sub(repl, out)
    if "reasoning_content" not in out:  # Qwen3 also splits content, to read the reasoning out of it: that stays
        out = _DROP_INLINE.sub("", out)
    return out


def _strip_reasoning(text: str, start: str, end: str) -> str:
    """`text` without reasoning blocks (and a block the generation prompt leaves open at the end)."""
    s, e = re.escape(start), re.escape(end)
    return re.sub(rf"{s}.*?{e}\s*|{s}\s*$", "", text, flags=re.DOTALL)


def template_text(tok: Any) -> str:
    template = getattr(tok, "chat_template", None)
    if isinstance(template, dict):  # some tokenizers keep several named templates
        template = template.get("default") or next(iter(template.values()), None)
    return str(template or "")


_THINKING_CHECKED: dict[tuple[str, str, str, str, str], str | None] = {}


def check_multi_turn_template(
    tok: Any, mode: str, tool_role: str = "tool", start: str = "", end: str = ""
) -> str | None:
    """The check a multi-turn env runs at start: for a template without a reasoning block (`start` ""), the token
    prefix check (`check_prefix_property_once`); for a thinking model's, `check_thinking_template` in `mode`. The
    template to render with (None: the tokenizer's own)."""
    if mode not in THINKING_MODES:
        raise ValueError(f"thinking must be one of {THINKING_MODES}, got {mode!r}")
    if not start:
        check_prefix_property_once(tok, tool_role=tool_role)
        return None
    return check_thinking_template(tok, mode, tool_role, start, end)


def check_thinking_template(
    tok: Any, mode: str, tool_role: str = "tool", start: str = "<think>", end: str = "</think>"
) -> str | None:
    """Check the template for training a thinking model in `mode`, once per tokenizer, template, mode and markers;
    the template to render with (keep: the variant that keeps reasoning; split: None, the tokenizer's own).

    split: the template may drop reasoning from the history (the env starts a new chain there), but must not
    rewrite anything else: checked on the probe with reasoning blocks taken out of both renderings. keep: the
    variant must render every turn's reasoning and extend itself token for token (`check_prefix_property`).
    ThinkingTemplateError (a PosttrainError with its fix) otherwise: training would use contexts the model never
    sees."""
    if mode not in THINKING_MODES:
        raise ValueError(f"thinking must be one of {THINKING_MODES}, got {mode!r}")
    key = (_name(tok), template_text(tok), mode, tool_role, start + end)
    if key not in _THINKING_CHECKED:
        _THINKING_CHECKED[key] = _check_thinking(tok, mode, tool_role, start, end)
    return _THINKING_CHECKED[key]


def _check_thinking(tok: Any, mode: str, tool_role: str, start: str, end: str) -> str | None:
    template = template_text(tok)
    if not template:
        raise ChatTemplateError(f"{_name(tok)} has no chat template: multi-turn envs need one")
    msgs = thinking_probe(start, end, tool_role)
    if mode == "split":
        for k in range(1, len(msgs)):
            longer = _strip_reasoning(tok.apply_chat_template(msgs[: k + 1], tokenize=False), start, end)
            shorter = [tok.apply_chat_template(msgs[:k], tokenize=False)]
            if msgs[k]["role"] == "assistant":
                shorter.append(tok.apply_chat_template(msgs[:k], tokenize=False, add_generation_prompt=True))
            for text in (_strip_reasoning(s, start, end) for s in shorter):
                if not longer.startswith(text):
                    i = next((j for j, (a, b) in enumerate(zip(text, longer)) if a != b), len(longer))
                    raise ThinkingTemplateError(
                        f"the chat template of {_name(tok)} rewrites more than the reasoning of earlier turns: "
                        f"rendering {k + 1} messages does not extend the rendering of the first {k}, reasoning left "
                        f"aside (char {i}: {text[i : i + 30]!r} -> {longer[i : i + 30]!r}; message {k} is "
                        f"{msgs[k]['role']!r}). Training would use contexts the model never sees at inference"
                    )
        return None
    variant = keep_reasoning_template(template)
    full = tok.apply_chat_template(msgs, tokenize=False, chat_template=variant)
    lost = [m["content"] for m in msgs if m["role"] == "assistant" and _reasoning_of(m["content"], end) not in full]
    if lost:
        raise ThinkingTemplateError(
            f"thinking: keep, but the chat template of {_name(tok)} drops the reasoning of an earlier assistant "
            f"turn ({_reasoning_of(lost[0], end)!r}) and no known rewrite of it keeps it"
        )
    try:
        check_prefix_property(_WithTemplate(tok, variant), msgs, tool_role=tool_role)
    except ChatTemplateError as e:
        raise ThinkingTemplateError(
            f"thinking: keep, but the template that keeps reasoning is not prefix-stable: {e}"
        ) from None
    return variant


def _reasoning_of(content: str, end: str) -> str:
    return content.split(end)[0].split("\n")[1] if end in content else ""


class _WithTemplate:
    """A tokenizer whose apply_chat_template uses `template` (check_prefix_property's view of a variant)."""

    def __init__(self, tok: Any, template: str):
        self._tok, self.chat_template, self.name_or_path = tok, template, _name(tok)

    def apply_chat_template(self, messages: Any, **kwargs: Any) -> Any:
        return self._tok.apply_chat_template(messages, chat_template=self.chat_template, **kwargs)

    def decode(self, ids: Any, **kwargs: Any) -> str:
        return self._tok.decode(ids, **kwargs)
