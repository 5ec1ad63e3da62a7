"""Loading models and tokenizers (default GGUF, HF folders, hub ids, tiny-random), LoRA, chat templates."""

from posttrain.models.chat import prompt_text, render_prompt
from posttrain.models.load import ModelLoadError, ensure_pad_token, load_model, stop_token_ids

__all__ = ["ModelLoadError", "ensure_pad_token", "load_model", "prompt_text", "render_prompt", "stop_token_ids"]
