"""The `sampling:` section: the rollout engine (own decode loop or vLLM, `sampling.vllm:`) and its settings."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from posttrain.config.strict import Strict


class VLLMConfig(Strict):
    """sampling.engine=vllm: how the vLLM engines are started (in process, inside Ray sampler actors, or as servers)."""

    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto",
        description=(
            "the engine's weights: auto = the trainer's (model.dtype); bfloat16 on a CPU engine measured 0.03 mean / "
            "0.41 max |log-prob| off the fp32 trainer (the truncated-IS correction takes it)"
        ),
    )
    kv_cache_gb: float = Field(
        default=1.0,
        gt=0.0,
        description="KV-cache memory per engine in GiB (CPU build; on a GPU see gpu_memory_utilization)",
    )
    max_model_len: int | None = Field(
        default=None,
        ge=16,
        description="longest prompt + completion an engine accepts; default: the model's limit, at most 4096",
    )
    compile: bool = Field(
        default=False,
        description=(
            "torch.compile and CUDA graphs in the engine (vLLM's default); false (enforce_eager) starts in seconds "
            "instead of minutes, which is what tests and CPU runs want"
        ),
    )
    gpu_memory_utilization: float = Field(
        default=0.5,
        gt=0.0,
        le=1.0,
        description=(
            "GPU build: the share of GPU memory the engine may take (weights + KV cache); the rest is the trainer's"
        ),
    )
    tensor_parallel_size: int = Field(default=1, ge=1, description="GPU build: GPUs one engine shards the model over")
    sleep_mode: bool = Field(
        default=False,
        description=(
            "GPU build: put the engine to sleep (weights offloaded, KV cache freed) while the trainer steps; the CPU "
            "build refuses it"
        ),
    )
    lora: Literal["adapter", "merged"] = Field(
        default="adapter",
        description=("with lora.enabled: push the adapter alone (vLLM's LoRA) or the merged full weights each step"),
    )
    weight_update: Literal["wait", "in_flight"] = Field(
        default="wait",
        description=(
            "how a push meets the requests an engine is generating: wait (they finish on the old weights first: one "
            "version per completion) or in_flight (generation pauses between tokens and the same requests continue on "
            "the new weights, each token stamped with its version; the loss corrects per token); for loop.mode=async"
        ),
    )
    extra: dict = Field(
        default_factory=dict, description="more vllm.LLM / server keyword arguments, passed through as given"
    )


class SamplingConfig(Strict):
    engine: Literal["own", "vllm"] = Field(
        default="own",
        description=(
            "what samples rollouts: own (posttrain's decode loop, no extra dependency) or vllm (pip install "
            "'posttrain[vllm]'; in process with cluster.backend=local, inside the sampler actors with ray, as "
            "supervised servers with server; docs/engines.md). Eval, the env check and the judge audit keep "
            "the own loop"
        ),
    )
    vllm: VLLMConfig = VLLMConfig()
    max_tokens: int | None = Field(default=None, ge=1, description="new tokens per completion; default: the task's")
    max_context: int | None = Field(
        default=None,
        ge=16,
        description=(
            "the most tokens a prompt and its completion may take together; default: the model's positions (and an "
            "engine's max_model_len). A sampling call past it fails that sample alone, a multi-turn episode that grows "
            "past it ends with a context stop and is trained on as truncated (sampling/context.py)"
        ),
    )
    context_overflow: Literal["fail", "truncate"] = Field(
        default="fail",
        description=(
            "a prompt whose max_tokens do not fit the context: fail that sample with the reason, or cut its max_tokens "
            "to what fits (at least 16 tokens)"
        ),
    )
    # Temperatures are finite: an infinite one samples uniformly from the vocabulary (logits / inf), a NaN fails.
    temperature: float = Field(
        default=0.7,
        ge=0.0,
        allow_inf_nan=False,
        description="training rollouts; the trainer scores tokens at the same temperature",
    )
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="nucleus sampling (1 = off)")
    top_k: int = Field(default=0, ge=0, description="top-k sampling (0 = off)")
    stop: list[str] | None = Field(
        default=None,
        description="stop strings (the text is cut before the stop; the tokens keep it); null: the task's, []: none",
    )
    cuda_graphs: bool = Field(
        default=False,
        description=(
            "GPU decode fast path: a static KV cache and the decode step replayed as a CUDA graph (torch.compile "
            "reduce-overhead, compiled once per batch/length bucket; sampling/graph_decode.py); LoRA samplers decode "
            "eagerly; on a CPU the same loop runs uncompiled"
        ),
    )
    eval_temperature: float = Field(default=0.0, ge=0.0, allow_inf_nan=False, description="0 = greedy held-out eval")
    prefix_cache_tokens: int = Field(
        default=32768,
        ge=0,
        description=(
            "multi-turn episodes: keep each turn's KV cache (at most this many tokens, least recently used dropped) so "
            "the next turn prefills only its new tokens; dropped at every weight change; 0 = off "
            "(sampling/prefix_cache.py; about 46 KB per token for the default model in fp32)"
        ),
    )
    precision: Literal["fp32", "bf16", "int8"] = Field(
        default="fp32",
        description=(
            "rollout sampler's weights: fp32 (shares the trainer's), or a bf16 / int8 copy refreshed at each sync; "
            "not fp32 makes algorithm.behavior_logprobs default to sampler and is_correction to truncate"
        ),
    )
    packed_weights: Literal["auto", "on", "off"] = Field(
        default="auto",
        description=(
            "CPU decode with the sampler's Linear weights packed once by oneDNN at each sync instead of re-packed by "
            "every matmul (sampling/packed_linear.py). auto: pack whenever the sampler holds a copy of its own (a "
            "bf16 copy, or the async loop's fp32 copy unless it has LoRA adapters) and the CPU can pack that dtype; "
            "on: also give the sync loop's "
            "fp32 sampler a packed copy of its own (one more copy of the weights in memory); off: never. int8 and GPU "
            "samplers are not packed"
        ),
    )

    @field_validator("packed_weights", mode="before")
    @classmethod
    def _yaml_on_off(cls, v):
        """YAML (and so the command line) reads on/off as booleans."""
        return {True: "on", False: "off"}.get(v, v) if isinstance(v, bool) else v
