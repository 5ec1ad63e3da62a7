"""Host tools the launch chain uses, and the error raised when isolation cannot run."""

from __future__ import annotations

import shutil

from posttrain.errors import PosttrainError


class SandboxUnavailable(PosttrainError, RuntimeError):
    """The requested isolation cannot run here (or only the unsafe backend could, and it was not allowed)."""

    fix = "install bubblewrap (apt-get install bubblewrap); docs/sandbox.md says what each backend needs"


def tool(name: str) -> str:
    """Absolute path of a util-linux/coreutils tool used in the launch chain; all live under the bound /usr."""
    path = shutil.which(name, path="/usr/bin:/bin:/usr/sbin:/sbin")
    if path is None:
        raise SandboxUnavailable(f"{name} not found (util-linux / coreutils)")
    return path
