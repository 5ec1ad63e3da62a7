"""The trainer's weights as a vLLM engine takes them, and the `WeightSync` that pushes them every step.

    hf_state(model)                         full weights under HF checkpoint names (a LoRA model merged, out of place)
    write_model_folder(model, tok, target)  an HF folder of those weights: what an engine starts from
    EngineWeights(model, engine, lora)      WeightSync: push(version) moves the weights in, then checks the engine
                                            reports `version`

vLLM loads checkpoint names (`model.layers.0.self_attn.q_proj.weight`) and stacks q/k/v and gate/up itself, so the
trainer's own parameter names are what it takes. A peft model's names carry `base_model.model.` and `.base_layer`,
and its weights are the base plus the adapter's delta: `hf_state` computes W + scale * B @ A without touching the
trainer's tensors (merging in place and unmerging after would add rounding to the base at every step).

Under LoRA (sampling.vllm.lora=adapter) only the adapter moves: peft writes it as a folder of a few MB and the
engine serves it as a new LoRA id. `merged` pushes the merged full weights instead (bench/engines.py measures
both).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any, Protocol, cast

import torch


class _LoraDelta(Protocol):
    """What each of peft's LoRA layer classes (lora.Linear, Embedding, Conv...) defines; their LoraLayer base
    declares none of it."""

    def get_delta_weight(self, adapter: str) -> torch.Tensor: ...


def _is_peft(model: Any) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


@torch.no_grad()
def hf_state(model: Any, aliases: bool = True) -> dict[str, torch.Tensor]:
    """Every parameter under its HF checkpoint name, detached (no copy for a plain model). `aliases`: tied weights
    under each of their names. A reload needs them: vLLM's in-place reload unties `lm_head` from the embedding, so a
    push without `lm_head.weight` left the engine sampling with the old output layer (measured: log-probs 1.2 off
    the trainer's after one perturbed push, 1e-6 with it). A safetensors file wants each tensor once."""
    if not _is_peft(model):
        return {n: p.detach() for n, p in model.named_parameters(remove_duplicate=not aliases)}
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    merged: dict[str, torch.Tensor] = {}
    for name, module in base.named_modules():
        if isinstance(module, LoraLayer):
            w = cast(torch.Tensor, module.get_base_layer().weight).detach()  # nn.Module types it loosely
            for adapter in module.active_adapters:
                if adapter in module.lora_A:
                    w = w + cast(_LoraDelta, module).get_delta_weight(adapter).to(w.dtype)
            merged[f"{name}.weight"] = w
    out = {}
    for n, p in base.named_parameters(remove_duplicate=not aliases):
        if "lora_" in n:
            continue
        clean = n.replace(".base_layer.", ".")
        out[clean] = merged.get(clean, p.detach())
    return out


def with_output_layer(state: dict[str, torch.Tensor], tied: bool) -> dict[str, torch.Tensor]:
    """A tied model's output layer under its own name too (by reference): vLLM's in-place reload unties lm_head from
    the embedding, so a push must carry both."""
    if tied and "model.embed_tokens.weight" in state and "lm_head.weight" not in state:
        return {**state, "lm_head.weight": state["model.embed_tokens.weight"]}
    return state


def servable_state(state: dict[str, torch.Tensor], dtype: str, tied: bool) -> dict[str, torch.Tensor]:
    """Full HF-named weights as a vLLM server reloads them from a file: cast to the server's `dtype` (it reads no
    more bytes than it keeps), contiguous on the CPU, and with a tied model's output layer under its own name
    (vLLM's reload unties lm_head from the embedding, so both must be there); safetensors refuses two names on one
    storage, so a second name gets a copy."""
    state = with_output_layer(state, tied)
    cast = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}.get(dtype)
    out, seen = {}, set()
    for n, t in state.items():
        t = (t.detach().to(cast) if cast is not None and t.is_floating_point() else t.detach()).contiguous().cpu()
        if t.untyped_storage().data_ptr() in seen:
            t = t.clone()
        seen.add(t.untyped_storage().data_ptr())
        out[n] = t
    return out


def write_model_folder(model: Any, tokenizer: Any, target: str | Path) -> Path:
    """The model's current weights (merged under LoRA) as an HF folder: config, safetensors, tokenizer."""
    from safetensors.torch import save_file

    from posttrain.models.save import save_hf_folder

    class _Folder:  # save_hf_folder's atomic write, with our merged state instead of save_pretrained's
        def save_pretrained(self, d: Path) -> None:
            cfg = (model.get_base_model() if _is_peft(model) else model).config
            cfg.save_pretrained(d)
            state = {n: t.contiguous().cpu() for n, t in hf_state(model, aliases=False).items()}
            save_file(state, str(Path(d) / "model.safetensors"), metadata={"format": "pt"})

    return save_hf_folder(_Folder(), tokenizer, target)


class EngineWeights:
    """WeightSync for an engine in this process (sampling/vllm_engine.py VLLMSampler)."""

    def __init__(self, model: Any, engine: Any, lora: str = "adapter", work_dir: str | Path | None = None):
        """`lora`: adapter (push the adapter folder) or merged (push W + BA); ignored without LoRA. `work_dir`
        holds the adapter folders (one per version, the previous removed)."""
        self.model, self.engine = model, engine
        self.adapter = _is_peft(model) and lora == "adapter"
        if self.adapter and work_dir is None:
            raise ValueError("EngineWeights with LoRA adapters needs a work_dir for the adapter folders")
        self.work_dir = Path(work_dir) if work_dir is not None else None
        self._last_folder: Path | None = None

    def push(self, version: int) -> dict[str, float]:
        t0 = time.perf_counter()
        if self.adapter:
            assert self.work_dir is not None  # __init__ refuses adapters without a work_dir
            folder = self.work_dir / f"adapter-v{version}"
            self.model.save_pretrained(folder)  # peft: the adapter alone
            saved = time.perf_counter() - t0
            self.engine.load_adapter(folder, version)
            if self._last_folder is not None and self._last_folder != folder:
                shutil.rmtree(self._last_folder, ignore_errors=True)
            self._last_folder = folder
            extra = {"time/weight_file": saved}
        else:
            self.engine.load_weights(hf_state(self.model), version)
            extra = {}
        # Set after the load: set before, a call starting between the two would see the engine "miss" a push that
        # had not landed yet.
        self.engine.expected_version = version
        if self.engine.policy_version != version:  # the engine's own record, not ours
            from posttrain.sampling.vllm_engine import StaleEngineError

            raise StaleEngineError(f"after a push of version {version} the engine reports {self.engine.policy_version}")
        return {"time/weight_sync": time.perf_counter() - t0, **extra}

    def close(self) -> None:
        self.engine.close()
