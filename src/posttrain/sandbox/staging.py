"""A run's files on the host: written (`write_tree`) and staged (`stage_files`) under its staging dir, hidden from a
second uid (`hide_tree`), hashed after the run (`hash_tree`)."""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Mapping

from posttrain.sandbox.backends import NS_LAYOUT, Layout


def _safe_relpath(name: str) -> str:
    norm = os.path.normpath(name)
    if not name or os.path.isabs(name) or norm.startswith("..") or norm in (".", ""):
        raise ValueError(f"file name {name!r} must be a relative path inside the work dir")
    return norm


def write_tree(root: str, files: Mapping[str, str | bytes], mode: int = 0o644) -> None:
    """Write `files` (relative path -> content) under `root`; dirs 0755 so the run's uid can read them."""
    for name, content in files.items():
        path = os.path.join(root, _safe_relpath(name))
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        data = content.encode() if isinstance(content, str) else bytes(content)
        with open(path, "wb") as f:
            f.write(data)
        os.chmod(path, mode)


def hash_tree(root: str) -> dict[str, str]:
    """Relative path -> sha256 of every file under root (the graders check pristine tests against this)."""
    out = {}
    for dirpath, _, filenames in os.walk(root):
        for n in filenames:
            path = os.path.join(dirpath, n)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
    return out


def hide_tree(root: str, uid: int) -> None:
    """What a grader knows, readable by the grading process's uid alone: owner `uid`, dirs 0500, files 0400.

    The hidden-data rule: in a two-process run the graded code runs under a second uid, and the pristine tests
    hold the asserted values. World-readable, a solution that opens them could return what they assert (the
    bind mount keeps these host owners and modes, so they hold inside the sandbox)."""
    for dirpath, _dirnames, filenames in os.walk(root):
        for n in filenames:
            os.chown(os.path.join(dirpath, n), uid, uid, follow_symlinks=False)
            os.chmod(os.path.join(dirpath, n), 0o400)
        os.chown(dirpath, uid, uid)
        os.chmod(dirpath, 0o500)


def _chown_tree(root: str, uid: int) -> None:
    for dirpath, dirnames, filenames in os.walk(root):
        os.chown(dirpath, uid, uid)
        for n in dirnames + filenames:
            os.chown(os.path.join(dirpath, n), uid, uid, follow_symlinks=False)


def stage_files(
    stage: str,
    backend: str,
    uid: int | None,
    files: Mapping[str, str | bytes] | None,
    inputs: Mapping[str, str | bytes] | None,
    tests: Mapping[str, str | bytes] | None,
    hide_tests: bool,
) -> tuple[str, str | None, Layout]:
    """The run's files under `stage`: `in/` (an /etc for the run's user, the inputs, the files under `files/`),
    `tests/` when given (hidden from the solution's uid in a two-process run), and the layout the command sees
    (the unsafe backend works in copies under `stage`; the namespaced ones mount NS_LAYOUT)."""
    stage_in, stage_tests = os.path.join(stage, "in"), os.path.join(stage, "tests") if tests is not None else None
    os.makedirs(stage_in, mode=0o755)
    os.chmod(stage_in, 0o755)
    name = "sandbox" if uid is not None else "user"
    u, g = (uid, uid) if uid is not None else (os.getuid(), os.getgid())
    staged: dict[str, str | bytes] = {
        "etc/passwd": f"root:x:0:0::/:/bin/false\n{name}:x:{u}:{g}::/:/bin/false\n",
        "etc/group": f"root:x:0:\n{name}:x:{g}:\n",
    }
    staged.update(inputs or {})
    staged.update({f"files/{k}": v for k, v in (files or {}).items()})
    write_tree(stage_in, staged)
    if stage_tests is not None:
        os.makedirs(stage_tests, mode=0o755)
        write_tree(stage_tests, tests or {})
        if hide_tests and uid is not None:
            hide_tree(stage_tests, uid)
    if backend != "unsafe":
        return stage_in, stage_tests, NS_LAYOUT
    layout = Layout(work=f"{stage}/work", tmp=f"{stage}/tmp", inputs=stage_in, tests=stage_tests or "")
    shutil.copytree(os.path.join(stage_in, "files"), layout.work, dirs_exist_ok=True) if os.path.isdir(
        os.path.join(stage_in, "files")
    ) else os.makedirs(layout.work)
    os.makedirs(layout.tmp)
    if uid is not None:
        _chown_tree(layout.work, uid)
        _chown_tree(layout.tmp, uid)
    return stage_in, stage_tests, layout
