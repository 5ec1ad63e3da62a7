"""Turning a task prompt into token ids: chat messages through the model's chat template, strings as is."""

from __future__ import annotations

from typing import Any


def render_prompt(tok: Any, prompt: str | list[dict[str, Any]]) -> list[int]:
    if isinstance(prompt, str):
        return list(tok(prompt, add_special_tokens=False)["input_ids"])
    if not getattr(tok, "chat_template", None):
        raise ValueError(
            f"the tokenizer of {getattr(tok, 'name_or_path', 'this model')!r} has no chat template; "
            "use string prompts or a chat model"
        )
    out = tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=False)
    if isinstance(out, dict) or hasattr(out, "keys"):
        out = out["input_ids"]
    return [int(t) for t in out]


def prompt_text(tok: Any, prompt: str | list[dict[str, Any]]) -> str:
    if isinstance(prompt, str):
        return prompt
    return tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
