"""Chat-template prefix check: does rendering turn k+1 extend the rendering of turn k, token for token?

Multi-turn RL builds each episode incrementally from the sampler's own token ids: turn k+1's prompt is turn k's
prompt + the sampled completion + the environment's tokens. That is only the sequence the model will see at
inference if the chat template renders a longer conversation as an extension of a shorter one. Templates that
rewrite history (drop earlier reasoning, move a system prompt, re-format earlier tool calls) break it, and the
trainer then optimises tokens the model never sees in deployment. TRL, verl and prime-rl users lose runs to this;
we check once per model, before the first rollout, and fail with the first token that differs.
"""

from __future__ import annotations

from typing import Any

from posttrain.errors import PosttrainError


class ChatTemplateError(PosttrainError, ValueError):
    pass


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


def render_ids(tok: Any, messages: list[dict[str, Any]], add_generation_prompt: bool) -> list[int]:
    out = tok.apply_chat_template(
        messages, add_generation_prompt=add_generation_prompt, tokenize=True, return_dict=False
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
