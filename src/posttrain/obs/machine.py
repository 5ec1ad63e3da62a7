"""What machine a measurement ran on, for benchmark results.

Speed ratios on a CPU depend on its instruction set more than on anything posttrain does: the same bf16 sampler
decoded 1.42x faster than fp32 on an AVX2-only EPYC and 2.0x faster on one with AVX-512 BF16
(bench/sampler_precision.py, both with MKL's fp32 matmuls). Every benchmark
that reports a speed records this line beside it, so two results are only compared on like machines.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import TypedDict

# The flags that change which kernels torch, MKL and oneDNN pick, in the order they are reported.
_ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "avx_ne_convert")


class CpuSummary(TypedDict):
    model: str | None
    cores: int | None
    isa: list[str]
    torch_capability: str | None


def cpu_summary() -> CpuSummary:
    """{"model": ..., "cores": N, "isa": [flags present], "torch_capability": ...}; fields are None if unknown."""
    model, flags = None, set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "model name" and model is None:
                model = value.strip()
            elif key == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        model = platform.processor() or None
    try:
        import torch

        capability = torch.backends.cpu.get_cpu_capability()
    except Exception:  # noqa: BLE001 - torch missing or too old: the line is informational
        capability = None
    return {
        "model": model,
        "cores": os.cpu_count(),
        "isa": [f for f in _ISA_FLAGS if f in flags],
        "torch_capability": capability,
    }


def cpu_line() -> str:
    """One line for a results table: 'AMD EPYC, 2 cores, avx2 avx512f avx512_bf16 avx512_vnni (torch AVX512)'."""
    c = cpu_summary()
    isa = " ".join(c["isa"]) or "no AVX2"
    return f"{c['model'] or 'unknown CPU'}, {c['cores']} cores, {isa} (torch {c['torch_capability']})"
