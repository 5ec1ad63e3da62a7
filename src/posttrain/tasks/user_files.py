"""Importing a user's code: a Python file (a task file, a verifiers env file) under a module name of posttrain's own,
and the function a `module:function` or `path/file.py:function` spec names (`import_callable`)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from posttrain.bounded_files import open_regular
from posttrain.envs.task import TaskLoadError


class CallableImportError(TaskLoadError):
    """A `module:function` spec that names no function: no colon, a module that does not import, no such
    attribute, or one that is not callable."""

    fix = "name a function as 'package.module:function' (importable here) or 'path/to/file.py:function'"


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


def import_callable(spec: str, what: str, import_file: Callable[[Path], Any] | None = None) -> Callable[..., Any]:
    """The function `spec` names: `package.module:function`, or `path/to/file.py:function` (a target with a `/` or
    ending `.py`) imported by `import_file` (the caller's module naming). `what` names the spec in errors (e.g.
    "task"). Every failure is one CallableImportError line."""
    target, _, attr = spec.rpartition(":")
    if not target or not attr:
        raise CallableImportError(f"{what} {spec!r} must be 'package.module:function' or 'path/to/file.py:function'")
    if import_file is not None and (target.endswith(".py") or "/" in target):
        module = import_file(Path(target).expanduser())
    else:
        try:
            module = importlib.import_module(target)
        except Exception as e:  # noqa: BLE001 - the user's module ran: whatever it raises is its author's error
            raise CallableImportError(
                f"cannot import module {target!r} for {what} {spec!r}: {type(e).__name__}: {e}"
            ) from None
    fn = getattr(module, attr, None)
    if fn is None:
        raise CallableImportError(f"{target} has no function {attr!r}")
    if not callable(fn):
        raise CallableImportError(f"{target}:{attr} is a {type(fn).__name__}, not a function")
    return fn
