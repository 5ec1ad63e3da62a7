"""Opening a user's file within bounds: every file posttrain reads that a user named (a dataset, a config, a subset
file, a task file, preference pairs) is input from outside the process, so it is opened only when it is a regular
file, and its lines are read with a cap, never whole.

    path_kind(path, error)              "file", "dir" or None (nothing there); the real reason otherwise: a symlink
                                        loop, a dangling symlink, a FIFO, a device, permission denied
    open_regular(path, error)           a regular file opened for binary reading, without blocking on a FIFO
    read_capped(f, path, error, cap)    the whole file, refused past `cap` bytes (read at most cap + 1)
    text_lines(f, path, error, ...)     (line number, text) one line at a time, each at most `line_bytes`, all of
                                        them at most `total_bytes`: a file without a newline is never read whole

`error` is the caller's own error type (any callable from a message to an exception): every problem is one line,
`PATH: reason` or `PATH:LINE: reason`. Imports only the stdlib.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO, Literal

ErrorType = Callable[[str], Exception]

_KINDS = [
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
]


def _kind_of(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def os_reason(path: Path, e: OSError) -> str:
    """What an OSError from opening or stat-ing `path` means, in words."""
    if e.errno == errno.ELOOP:
        return "a symlink loop (too many levels of symbolic links)"
    if isinstance(e, FileNotFoundError):
        if path.is_symlink():
            return f"a symlink to {os.readlink(path)}, which does not exist"
        return "no such file"
    if isinstance(e, PermissionError):
        return "permission denied"
    if e.errno == errno.ENAMETOOLONG:
        return "the name is too long"
    return e.strerror or type(e).__name__


def path_kind(path: Path, error: ErrorType) -> Literal["file", "dir"] | None:
    """Whether `path` (symlinks followed) is a regular file, a folder, or nothing (None: it does not exist, or a
    folder on its way is a file). Anything else raises `error` with the reason: a symlink loop or a dangling
    symlink, a FIFO, a device, a socket, a permission error."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError) as e:
        if path.is_symlink():
            raise error(f"{path}: {os_reason(path, e)}") from None
        return None
    except OSError as e:
        raise error(f"{path}: {os_reason(path, e)}") from None
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    raise error(f"{path}: {_kind_of(mode)}, not a regular file or folder")


def open_regular(path: Path, error: ErrorType) -> BinaryIO:
    """`path` opened for binary reading when it is a regular file; otherwise `error` with the reason. Opened
    non-blocking and checked on the open descriptor (fstat): a FIFO is refused, never waited on, and nothing can
    swap the file between the check and the read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise error(f"{path}: {os_reason(path, e)}") from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise error(f"{path}: a folder, not a regular file")
        if not stat.S_ISREG(mode):
            raise error(f"{path}: {_kind_of(mode)}, not a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_capped(f: BinaryIO, path: Path, error: ErrorType, cap: int, hint: str = "") -> bytes:
    """The rest of `f`, refused when it is over `cap` bytes (at most cap + 1 are read to tell)."""
    data = f.read(cap + 1)
    if len(data) > cap:
        raise error(f"{path}: more than {cap:,} bytes{hint}")
    return data


def text_lines(
    f: BinaryIO, path: Path, error: ErrorType, line_bytes: int, total_bytes: int, keep_ends: bool = False
) -> Iterator[tuple[int, str]]:
    """(line number from 1, the line as UTF-8 text) for each line of `f`, read one at a time: a line over
    `line_bytes` (its newline aside) or a file over `total_bytes` read so far raises `error` naming the line, so
    at most one capped line is ever in memory beside what the caller keeps. A byte-order mark is dropped."""
    n = total = 0
    while True:
        line = f.readline(line_bytes + 1)
        if not line:
            return
        n += 1
        total += len(line)
        if len(line) > line_bytes and not line.endswith(b"\n"):
            raise error(
                f"{path}:{n}: a line longer than {line_bytes:,} bytes (the most one row may take); "
                "is it one row a line?"
            )
        if total > total_bytes:
            raise error(f"{path}:{n}: more than {total_bytes:,} bytes read; read fewer rows or split the file")
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as e:
            raise error(f"{path}:{n}: not UTF-8 text (byte {e.start + 1} of the line)") from None
        if n == 1:
            text = text.removeprefix("\ufeff")
        yield n, text if keep_ends else text.rstrip("\r\n")
