"""Importing a user's Python file (a task file, a verifiers env file) under a module name of posttrain's own."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

from posttrain.bounded_files import open_regular
from posttrain.envs.task import TaskLoadError


def import_user_file(path: Path, mod_name: str, what: str, reuse: bool = False) -> Any:
    """A user's Python file imported as `mod_name` (registered in sys.modules: pickling by reference finds it); any
    failure is one TaskLoadError line. `reuse`: a module already imported under that name is returned as it is."""
    if not path.exists() and not path.is_symlink():
        raise TaskLoadError(f"{what} not found: {path}")
    # Only a regular file is imported: a FIFO would block the import's read forever (the check is on the open file).
    open_regular(path, lambda m: TaskLoadError(f"{what} {m}")).close()
    if reuse and mod_name in sys.modules:
        return sys.modules[mod_name]
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:
        raise TaskLoadError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        sys.modules.pop(mod_name, None)
        raise TaskLoadError(f"importing {path} failed: {type(e).__name__}: {e}") from e
    return module
