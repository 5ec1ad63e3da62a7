"""Checkpoints: trainer state + RNG states + loop state, one folder per step, written atomically.

Layout: RUN_DIR/checkpoints/step_000010/{stepper.pt, rng.pt, loop_state.json}. The folder is assembled under
a temporary name and renamed into place, so a crash mid-write never leaves a checkpoint that looks whole.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import torch

from posttrain.errors import PosttrainError


class CheckpointError(PosttrainError, RuntimeError):
    """A checkpoint could not be written (most often: the disk is full)."""


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def save_checkpoint(
    run_dir: Path,
    step: int,
    states: dict[str, Any],
    sampler_generator: torch.Generator,
    loop_state: dict[str, Any],
    keep: int = 2,
) -> Path:
    """`states`: file name -> object saved with torch.save (the stepper's state_dict); `loop_state`: JSON."""
    root = checkpoint_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp-step_{step:06d}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        for name, obj in states.items():
            torch.save(obj, tmp / name)
        torch.save(
            {"torch": torch.get_rng_state(), "sampler": sampler_generator.get_state(), "python": random.getstate()},
            tmp / "rng.pt",
        )
        (tmp / "loop_state.json").write_text(json.dumps({"step": step, **loop_state}, indent=2))
    except (OSError, RuntimeError) as e:  # torch reports a full disk as "enforce fail ... unexpected pos"
        shutil.rmtree(tmp, ignore_errors=True)  # free what was written; the last whole checkpoint stays
        free = shutil.disk_usage(root).free
        raise CheckpointError(
            f"could not write the checkpoint of step {step} to {root} ({free / 2**30:.2f} GiB free on that disk; "
            f"the last complete checkpoint is kept): {e}. Free some space, or checkpoint less often "
            "(loop.save_every, loop.keep_checkpoints), then resume the run"
        ) from e
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    for old in sorted(p for p in root.iterdir() if p.name.startswith("step_"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(run_dir: Path) -> Path | None:
    root = checkpoint_dir(run_dir)
    if not root.exists():
        return None
    done = sorted(p for p in root.iterdir() if p.name.startswith("step_") and (p / "loop_state.json").exists())
    return done[-1] if done else None


def load_checkpoint(path: Path, sampler_generator: torch.Generator) -> dict[str, Any]:
    """Restore the RNG states; returns the loop state (the caller loads its own state files)."""
    rng = torch.load(path / "rng.pt", weights_only=False)
    torch.set_rng_state(rng["torch"])
    sampler_generator.set_state(rng["sampler"])
    random.setstate(rng["python"])
    return json.loads((path / "loop_state.json").read_text())
