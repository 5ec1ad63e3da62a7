"""The `model:` and `lora:` sections: which model, on what device and in what arithmetic, and its LoRA adapters."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from posttrain.config.strict import Strict


class ModelConfig(Strict):
    name: str = Field(
        default="default",
        description="'default' (SmolLM2-135M-Instruct), 'tiny-random', a local HF folder, or a hub id",
    )
    device: str = Field(default="auto", description="auto (cuda when present, else cpu), cpu, cuda or cuda:N")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto", description="auto: bfloat16 on a GPU, float32 on the CPU"
    )
    threads: int | None = Field(default=None, ge=1, description="torch threads; default: all cores")
    attn_implementation: str = Field(
        default="sdpa", description="transformers attention backend (sdpa, eager, flash_attention_2)"
    )
    cpu_matmul: Literal["auto", "onednn", "mkl"] = Field(
        default="auto",
        description=(
            "fp32 Linear layers on the CPU: onednn (oneDNN's inner product for every product), mkl (torch's default), "
            "or auto: MKL on Intel CPUs; elsewhere oneDNN for decode (1.3-1.85x MKL on AMD EPYCs) and for training "
            "where torch runs AVX-512 kernels (1.57x; on AVX2 oneDNN trains 0.75x as fast); models/matmul.py"
        ),
    )

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        import re

        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", v):
            raise ValueError(f"model.device must be auto, cpu, cuda or cuda:N, got {v!r}")
        return v


class LoraConfig(Strict):
    enabled: bool = Field(default=False, description="train LoRA adapters (peft) instead of all weights")
    r: int = Field(default=16, ge=1, description="adapter rank")
    alpha: float = Field(default=32.0, description="LoRA scaling numerator (scale = alpha / r)")
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0, description="dropout on the adapter input")
    target_modules: list[str] = Field(
        default=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        description="module names that get adapters",
    )
