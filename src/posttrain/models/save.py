"""Writing a HF model folder atomically: a temp folder beside the target, then one rename, so a crash never
leaves a half-written folder that looks complete (the default model's cache, a reward model, a run's final/)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any


def save_hf_folder(model: Any, tokenizer: Any, target: str | Path, extra_files: dict[str, str] | None = None) -> Path:
    """`model.save_pretrained` + `tokenizer.save_pretrained` (+ `extra_files`: name -> text) into `target`,
    replacing what was there only once everything is written."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text)
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target
