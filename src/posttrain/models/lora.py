"""LoRA adapters through peft."""

from __future__ import annotations

from typing import Any


def apply_lora(model: Any, r: int, alpha: float, dropout: float, target_modules: list[str]) -> Any:
    from peft import LoraConfig, get_peft_model

    names = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
    missing = [m for m in target_modules if m not in names]
    if len(missing) == len(target_modules):
        raise ValueError(
            f"none of lora.target_modules {target_modules} exist in the model; "
            f"module names include: {sorted(n for n in names if n)[:20]}"
        )
    cfg = LoraConfig(
        r=r,
        lora_alpha=alpha,  # pyright: ignore[reportArgumentType]  # peft annotates int; its scale alpha / r takes a float
        lora_dropout=dropout,
        target_modules=[m for m in target_modules if m in names],
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, cfg)


def count_parameters(model: Any) -> tuple[int, int]:
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    return trainable, total
