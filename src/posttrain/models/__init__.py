"""Loading models and tokenizers (default GGUF, HF folders, hub ids, tiny-random), LoRA, chat templates.

The loaders (torch, transformers) are imported on first use, so that `posttrain.models.chat` and
`template_check` stay light for the processes that only render prompts (envs, Ray env workers).
"""

from typing import TYPE_CHECKING, Any

from posttrain.models.chat import prompt_text, render_prompt

if TYPE_CHECKING:  # loaded by __getattr__ on first use; named here for the type checker
    from posttrain.models.load import ModelLoadError, ensure_pad_token, load_model, stop_token_ids

__all__ = ["ModelLoadError", "ensure_pad_token", "load_model", "prompt_text", "render_prompt", "stop_token_ids"]

_LAZY = {"ModelLoadError", "ensure_pad_token", "load_model", "stop_token_ids"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from posttrain.models import load

        return getattr(load, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
