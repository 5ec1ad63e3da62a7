"""Load a policy model and its tokenizer from any supported source.

Sources, by `model.name`: "default" (SmolLM2-135M-Instruct from the installed GGUF, cached as HF folder),
"tiny-random" (tests), a local HF folder, a GGUF file path, or a hub id (needs network access).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from posttrain.errors import PosttrainError
from posttrain.models.default import DEFAULT_MODEL, default_model_dir

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelLoadError(PosttrainError, RuntimeError):
    pass


def resolve_model_path(name: str, log=print) -> str:
    """Map a model name to something `from_pretrained` takes (a folder or hub id)."""
    if name in ("default", DEFAULT_MODEL):
        return str(default_model_dir(log=log))
    return name


def load_model(
    name: str, dtype: str = "float32", attn_implementation: str = "sdpa", seed: int = 0, log=print
) -> tuple[Any, Any]:
    """Return (model, tokenizer), the model in eval mode on CPU (the caller moves it)."""
    if name == "tiny-random":
        from posttrain.models.tiny import tiny_random_model

        model, tok = tiny_random_model(seed=seed)
        # transformers' @wraps(Module.to) hides that `to` is a bound method
        return model.to(DTYPES[dtype]).eval(), tok  # pyright: ignore[reportArgumentType]  # @wraps hides `self`

    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model_path(name, log=log)
    p = Path(path)
    kwargs: dict[str, Any] = {"dtype": DTYPES[dtype], "attn_implementation": attn_implementation}
    if p.suffix == ".gguf":
        if not p.exists():
            raise ModelLoadError(f"GGUF file not found: {p}")
        tok = AutoTokenizer.from_pretrained(p.parent, gguf_file=p.name)
        model = AutoModelForCausalLM.from_pretrained(p.parent, gguf_file=p.name, **kwargs)
        # weights are dequantized; keep save_pretrained working
        model.hf_quantizer = None  # pyright: ignore[reportArgumentType]  # undeclared in transformers: Module's setattr types
        return model.eval(), tok
    if p.exists() and (p / "adapter_config.json").exists() and not (p / "config.json").exists():
        return _load_adapter_folder(p, dtype, attn_implementation, seed, log)
    if p.exists():
        if not (p / "config.json").exists():
            raise ModelLoadError(f"{p} is a folder but holds no config.json; is it a HF model folder?")
    elif _looks_like_path(path):
        raise ModelLoadError(f"model folder not found: {path}")
    try:
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except OSError as e:
        offline = os.environ.get("HF_HUB_OFFLINE") == "1"
        raise ModelLoadError(
            f"could not load model {path!r}: {e}\n"
            "If this is a hub id, this machine needs network access to the hub"
            f"{' (HF_HUB_OFFLINE=1 is set)' if offline else ''}; "
            "otherwise pass a local HF folder, a .gguf file, 'default' or 'tiny-random'."
        ) from None
    return model.eval(), tok


def _load_adapter_folder(p: Path, dtype: str, attn_implementation: str, seed: int, log) -> tuple[Any, Any]:
    """A LoRA run's `final/` folder holds only the adapter: load its base model, apply it and merge it, so the
    result samples as fast as a plain model."""
    import json

    from peft import PeftModel

    base = json.loads((p / "adapter_config.json").read_text()).get("base_model_name_or_path")
    if not base:
        raise ModelLoadError(f"{p} is a LoRA adapter without base_model_name_or_path in adapter_config.json")
    model, tok = load_model(base, dtype, attn_implementation, seed=seed, log=log)
    if (p / "tokenizer_config.json").exists():
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(p)
    return PeftModel.from_pretrained(model, p).merge_and_unload().eval(), tok


def _looks_like_path(name: str) -> bool:
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or os.sep in name and name.count("/") != 1


def ensure_pad_token(tok: Any) -> None:
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token


def stop_token_ids(model: Any, tok: Any) -> list[int]:
    """Token ids that end a completion: the tokenizer's eos plus the generation config's eos ids."""
    ids: set[int] = set()
    if tok.eos_token_id is not None:
        ids.add(int(tok.eos_token_id))
    gen = getattr(model, "generation_config", None)
    eos = getattr(gen, "eos_token_id", None) if gen is not None else None
    if isinstance(eos, int):
        ids.add(eos)
    elif isinstance(eos, (list, tuple)):
        ids.update(int(e) for e in eos)
    return sorted(ids)
