"""Host-side tmpfs mounts for a run's staging dir and writable box (root only).

Why mount on the host instead of letting bwrap make the tmpfs: bwrap has no option for `nr_inodes`, and an
uncapped tmpfs lets a run create files without content until time runs out (each costs kernel memory). A
staging dir on its own tmpfs also keeps host paths out of the sandbox: /proc/self/mountinfo names a bind
mount's source directory relative to its filesystem, which for a dir under /tmp would be the host path.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os

MNT_DETACH = 2
MS_NOSUID, MS_NODEV = 0x2, 0x4


@functools.lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def mount_tmpfs(path: str, size_bytes: int, nr_inodes: int, mode: int = 0o755, name: str = "ptsb") -> None:
    """Mount a fresh tmpfs at `path`; raises OSError when this process may not mount."""
    opts = f"size={size_bytes},nr_inodes={nr_inodes},mode={mode:o}".encode()
    if _libc().mount(name.encode(), path.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, opts) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount tmpfs at {path}: {os.strerror(err)}")


def unmount(path: str) -> None:
    """Lazy unmount (MNT_DETACH): frees the tmpfs once nothing uses it, never blocks. Errors are ignored."""
    _libc().umount2(path.encode(), MNT_DETACH)


@functools.lru_cache(maxsize=1)
def probe(base: str) -> str | None:
    """None when this process can mount a tmpfs under `base`, else why not."""
    import tempfile

    try:
        d = tempfile.mkdtemp(prefix="posttrain-mnt-", dir=base)
    except OSError as e:
        return f"cannot make a dir under {base}: {e}"
    try:
        mount_tmpfs(d, 1 << 20, 16)
        unmount(d)
        return None
    except OSError as e:
        return str(e)
    finally:
        try:
            os.rmdir(d)
        except OSError:
            pass
