"""The KL term's reference policy when a run starts with a supervised warm start.

`algorithm.beta > 0` pulls the policy toward a frozen reference. Without a warm start the reference is the base
model (builder.py: a frozen copy, or the base under LoRA's disabled adapters). With one, the reference must be the
warm-started policy, as in the field's recipe (the SFT model is the reference of InstructGPT's and DeepSeek-R1's
RL): a base-model reference pulls a drawing policy back toward the `import pygame` programs the warm start was
there to remove, so the KL term would fight the run instead of keeping it near what it learned.

The warm-started weights exist in memory only once (the policy moves from the first RL step), so they are also
written to the run dir: `posttrain train --resume` of a run past step 0 has no other copy of them (the step-0
checkpoint may have been rotated out by `loop.keep_checkpoints`).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from posttrain.config.schema import Config
from posttrain.errors import MissingFileError

REFERENCE_FILE = "warm_start_reference.pt"

if TYPE_CHECKING:  # annotations only (components imports the model stack)
    from posttrain.loop.components import Components


def needs_reference(cfg: Config) -> bool:
    return cfg.algorithm.beta > 0 and cfg.algorithm.stepper == "policy_gradient" and cfg.warm_start.steps > 0


def _frozen(module: Any) -> Any:
    return module.eval().requires_grad_(False)


def reference_after_warm_start(cfg: Config, c: Components, run_dir: Path) -> Any | None:
    """The warm-started policy as the reference (the run's `ref_model` from now on), saved. None when no KL term
    needs it."""
    if not needs_reference(cfg):
        return None
    ref: Any = c.ref_model
    if ref is not None:  # full fine-tune: reuse the base copy's memory
        ref.load_state_dict(c.model.state_dict())
    else:  # LoRA: the reference is the warm-started adapters, no longer the base under disabled ones
        ref = _frozen(copy.deepcopy(c.model))
    _frozen(ref)
    tmp = run_dir / (REFERENCE_FILE + ".tmp")
    torch.save(ref.state_dict(), tmp)
    tmp.replace(run_dir / REFERENCE_FILE)  # never a half-written reference after a crash
    return ref


def restore_reference(cfg: Config, c: Components, run_dir: Path) -> Any | None:
    """On resume of a warm-started run: the saved reference (the run's `ref_model` from now on). None when no KL
    term needs it."""
    if not needs_reference(cfg):
        return None
    path = run_dir / REFERENCE_FILE
    if not path.exists():
        raise MissingFileError(
            f"{path} is missing: this run warm-started with algorithm.beta > 0, and its KL reference (the "
            "warm-started policy) was saved there; without it the run cannot resume with the same objective: "
            "start a new run"
        )
    ref: Any = c.ref_model
    if ref is None:
        ref = copy.deepcopy(c.model)
    ref.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    return _frozen(ref)
