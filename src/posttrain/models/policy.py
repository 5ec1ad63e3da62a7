"""The policy's model from a Config: device, dtype, threads and seed resolved, the base model loaded and routed,
LoRA adapters added. The run (loop/components.py), trainer ranks (training/launch.py) and sampler actors
(cluster/sampler_worker.py) all build their copy through these, so every copy matches the trainer's."""

from __future__ import annotations

import os
import random
from typing import Any

import torch

from posttrain.config.schema import Config
from posttrain.models.load import ensure_pad_token, load_model
from posttrain.models.lora import apply_lora
from posttrain.models.matmul import route_linears_


def set_threads(cfg: Config) -> int:
    n = cfg.model.threads or os.cpu_count() or 1
    torch.set_num_threads(n)
    return n


def resolve_device(name: str) -> str:
    """`auto` is cuda when a GPU is visible, else cpu; a named device must exist."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"model.device={name} but torch sees no CUDA device (torch {torch.__version__})")
    return name


def resolve_dtype(dtype: str, device: str) -> str:
    """`auto`: bfloat16 on a GPU (half the memory traffic, the trainers' norm), float32 on the CPU (no fast bf16
    matmuls without AVX-512)."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if device.startswith("cuda") else "float32"


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def load_base_model(cfg: Config, log=print) -> tuple[Any, Any]:
    """The policy's model before LoRA, on its device, and its tokenizer (with a pad token). Sampler actors on
    other machines (cluster/) build their copy through this and `with_lora`, so it matches the trainer's."""
    device = resolve_device(cfg.model.device)
    model, tok = load_model(
        cfg.model.name,
        resolve_dtype(cfg.model.dtype, device),
        cfg.model.attn_implementation,
        seed=cfg.run.seed,
        log=log,
    )
    ensure_pad_token(tok)
    model = model.to(device)
    route_linears_(model, cfg.model.cpu_matmul)  # before LoRA wraps the Linears; a no-op on other devices' tensors
    return model, tok


def with_lora(cfg: Config, model: Any) -> Any:
    """The model with LoRA adapters when lora.enabled (only the adapters are then trainable), else itself."""
    if not cfg.lora.enabled:
        return model
    return apply_lora(model, cfg.lora.r, cfg.lora.alpha, cfg.lora.dropout, cfg.lora.target_modules)
