"""Rollout engines other than the own decode loop (sampling.engine=vllm), as `(sampler, WeightSync)` pairs for
loop/wiring.py's sampler backends (which import this module only when asked for vLLM):

    cluster.backend=local   one vLLM engine in this process, beside the trainer (sampling/vllm_engine.py)
    cluster.backend=server  cluster.num_servers vLLM servers started and supervised by the run (cluster/vllm_servers.py)
    cluster.backend=ray     a vLLM engine inside each sampler actor (cluster/sampler_worker.py builds it)

Every engine starts from an HF folder of the policy's base weights (the model's own folder when it has one, else one
written here), then gets the trainer's current weights (after any warm start) as the run's first push.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from posttrain.config.schema import Config
from posttrain.models.load import resolve_model_path, stop_token_ids
from posttrain.owned import OwnedDir
from posttrain.sampling.base import first_push
from posttrain.sampling.context import run_budget


def engine_model_dir(cfg: Config, model: Any, tokenizer: Any, work_dir: Path, log=print) -> str:
    """The folder engines load at start: the model's own HF folder, or (tiny-random, a GGUF file, a hub id, an
    adapter folder) the policy's weights written under `work_dir`."""
    if cfg.model.name != "tiny-random":
        p = Path(resolve_model_path(cfg.model.name, log=log))
        if (p / "config.json").exists() and any(p.glob("*.safetensors")):
            return str(p)
    from posttrain.sampling.vllm_weights import write_model_folder

    return str(write_model_folder(model, tokenizer, work_dir / "engine_model"))


def engine_spec(cfg: Config, model: Any, model_dir: str, max_lora_rank: int = 0) -> Any:
    """The config's sampling.vllm block as an EngineSpec."""
    import torch

    from posttrain.sampling.vllm_engine import EngineSpec

    v = cfg.sampling.vllm
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    limit = run_budget(cfg, base).max_context  # the model's positions, or the smaller sampling.max_context
    dtype = v.dtype if v.dtype != "auto" else str(next(model.parameters()).dtype).removeprefix("torch.")
    if dtype not in ("float32", "bfloat16", "float16"):
        dtype = "float32" if not torch.cuda.is_available() else "bfloat16"
    return EngineSpec(
        model_dir=model_dir,
        dtype=dtype,
        seed=cfg.run.seed,
        max_model_len=v.max_model_len or min(limit, 4096),
        kv_cache_gb=v.kv_cache_gb,
        compile=v.compile,
        gpu_memory_utilization=v.gpu_memory_utilization,
        tensor_parallel_size=v.tensor_parallel_size,
        sleep_mode=v.sleep_mode,
        max_lora_rank=max_lora_rank,
        extra=dict(v.extra),
    )


def lora_rank(cfg: Config) -> int:
    """The adapter rank the engine must serve: only when adapters are pushed as adapters."""
    return cfg.lora.r if cfg.lora.enabled and cfg.sampling.vllm.lora == "adapter" else 0


_WORK_DIRS: list[OwnedDir] = []  # held for the process's life: each removed at exit (or swept once it was killed)


def work_dir(cfg: Config) -> Path:
    """A private folder for engine files (a written model folder, adapter versions), removed at exit; named for this
    process, so that the next run removes it when this one was killed outright (posttrain/owned.py)."""
    d = OwnedDir.create("posttrain-engine-")
    _WORK_DIRS.append(d)
    return d.path


def local_vllm(cfg: Config, c: Any, say=print) -> tuple[Any, Any]:
    """One vLLM engine in this process. It holds its own copy of the weights, so the async loop is served too."""
    from posttrain.sampling.vllm_engine import VLLMSampler
    from posttrain.sampling.vllm_weights import EngineWeights

    wd = work_dir(cfg)
    spec = engine_spec(cfg, c.model, engine_model_dir(cfg, c.model, c.tokenizer, wd, log=say), lora_rank(cfg))
    engine = VLLMSampler(
        spec,
        c.tokenizer,
        stop_token_ids(c.model, c.tokenizer),
        log=say,
        context=run_budget(cfg, c.model, spec.max_model_len),
        in_flight=cfg.sampling.vllm.weight_update == "in_flight",
    )
    sync = EngineWeights(c.model, engine, cfg.sampling.vllm.lora, wd)
    first_push(sync, c.sampler.policy_version)  # the sampler serves what the trainer holds now
    return engine, sync
