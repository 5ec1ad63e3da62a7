"""The shared-memory blocks weights travel in (/dev/shm): created, named, checked and removed in this one place.

    block = create(nbytes)             sweeps dead owners' blocks, then a new block with all its space reserved
    with block.writing(version): ...   a fill; readers see the block as being written until it ends
    block = attach(name)               a reader's mapping of a block another process owns
    read_verified(block, copy, nbytes) copy once, verified whole and of one version (retried when a fill tore it)

Every block:
- is named `posttrain_<owner pid>_<pid namespace tag><random>`. An owner killed outright (SIGKILL, OOM, a scheduler
  killing the job's process group) runs no cleanup, so the next `create` on the host removes every block whose
  owner is no longer alive (`sweep`). Only blocks of this pid namespace are judged: a pid from a container that
  shares /dev/shm but not pids says nothing here. A pid reused since keeps its block until that process ends.
- is removed by its owner at `unlink()` (the owners' close), when the owner object is collected, and at
  interpreter exit (a finalizer), but never by a forked child of the owner.
- has its whole size reserved when it is created (posix_fallocate): /dev/shm is a tmpfs that would otherwise hand
  out pages only as they are first written, and a page it cannot provide is a SIGBUS in the trainer halfway through
  a fill. Too little room is `ShmSpaceError`, which names the fix, before anything is written.
- starts with a 64-byte header: magic, a sequence number (odd while a fill is in progress), the version, the
  payload's size and a digest of it. A reader takes a copy as a version only if the sequence number is even and
  the same before and after its copy and the bytes hash to the digest; otherwise it copies again, a bounded
  number of times (`TornReadError`). The digest is xxh3-128 where the xxhash package is installed (about 0.02 s
  for 270 MB on one core), blake2b-128 otherwise (about 0.35 s); the header says which.

Python's multiprocessing.shared_memory is not used: its resource tracker registers every block a process opens and
removes it when that process's tracker exits (an engine that attached and exited would delete the trainer's block;
processes that share one tracker unregister each other's names), and it gives no step between creating a block and
mapping it, where the space is reserved.
"""

from __future__ import annotations

import _posixshmem
import errno
import functools
import hashlib
import mmap
import os
import re
import secrets
import struct
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

from posttrain.errors import PosttrainError
from posttrain.owned import alive, ns_tag

SHM_DIR = "/dev/shm"  # where Linux's shm_open keeps blocks (what `sweep` lists)
PREFIX = "posttrain_"
HEADER_BYTES = 64
_MAGIC = b"ptshm\x00\x00\x01"
_HEAD = struct.Struct("<8sQqQB7x16s8x")  # magic, seq, version, payload bytes, digest algorithm, digest
_SEQ = struct.Struct("<Q")
_NAME = re.compile(rf"{PREFIX}(\d{{1,10}})_([0-9a-f]{{6}})[0-9a-f]{{6}}")
_BLAKE2B, _XXH3 = 1, 2
T = TypeVar("T")


class ShmSpaceError(PosttrainError):
    """/dev/shm has no room for the weight block."""

    fix = (
        "give shared memory more room: run the container with a bigger --shm-size (docker run --shm-size=4g) or "
        "free /dev/shm; or move weights without it: cluster.weight_transport=group (file for vLLM servers, "
        "object_store for Ray actors)"
    )


class TornReadError(RuntimeError):
    """A copy of a block that a fill changed under it (or that does not match its digest), every time it was tried."""


@dataclass(frozen=True)
class Header:
    seq: int  # odd while a fill is in progress
    version: int  # -1 until the first fill
    nbytes: int  # payload bytes the digest covers
    algo: int
    digest: bytes


class Block:
    """One mapping of a block: `buf` is all of it, the header then the payload (at HEADER_BYTES)."""

    def __init__(self, name: str, mm: mmap.mmap, owner: bool):
        self.name, self.owner, self._mmap = name, owner, mm
        self.buf = memoryview(mm)
        self.payload_bytes = len(mm) - HEADER_BYTES
        # Unlinked when the owner drops it or the interpreter exits; the pid keeps a forked child from doing it.
        self._finalizer = weakref.finalize(self, _unlink_name, name, os.getpid()) if owner else None

    def header(self) -> Header:
        magic, seq, version, nbytes, algo, digest = _HEAD.unpack_from(self.buf, 0)
        if magic != _MAGIC:
            raise ValueError(f"shared-memory block {self.name!r} is not a posttrain weight block")
        return Header(seq, version, nbytes, algo, digest)

    @contextmanager
    def writing(self, version: int, nbytes: int | None = None) -> Iterator[None]:
        """Around a fill of the payload: readers see a write in progress from its start; at its end the version and
        the digest of the first `nbytes` (all by default) are set. A fill that raises leaves the block marked as
        being written (it is torn) until a later fill completes."""
        seq = self.header().seq
        if seq % 2 == 0:
            seq += 1
            _SEQ.pack_into(self.buf, 8, seq)
        yield
        n = self.payload_bytes if nbytes is None else nbytes
        algo = _XXH3 if _has_xxhash() else _BLAKE2B
        _HEAD.pack_into(self.buf, 0, _MAGIC, seq, version, n, algo, self._digest(algo, n))
        _SEQ.pack_into(self.buf, 8, seq + 1)  # last: the fill is visible as a version only now

    def _digest(self, algo: int, nbytes: int) -> bytes:
        with self.buf[HEADER_BYTES : HEADER_BYTES + nbytes] as view:
            if algo == _XXH3:
                import xxhash

                return xxhash.xxh3_128(view).digest()
            if algo == _BLAKE2B:
                return hashlib.blake2b(view, digest_size=16).digest()
        raise TornReadError(f"shared-memory block {self.name!r}: unknown digest algorithm {algo}")

    def close(self) -> None:
        """Unmap; a tensor still viewing the block keeps the mapping until it goes (the OS frees it at exit)."""
        try:
            self.buf.release()
            self._mmap.close()
        except BufferError:
            pass

    def unlink(self) -> None:
        """The owner removes the name (a mapping still open elsewhere lives on until it is closed)."""
        if self._finalizer is not None:
            self._finalizer()


def create(payload_bytes: int) -> Block:
    """A new block of `payload_bytes` after the header, its space reserved; dead owners' blocks are removed first."""
    sweep()
    size = HEADER_BYTES + max(int(payload_bytes), 0)
    for _ in range(8):
        name = new_name()
        try:
            fd = _posixshmem.shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
        except FileExistsError:  # the random part collided: draw again
            continue
        try:
            _reserve(fd, size)
            mm = mmap.mmap(fd, size)
        except BaseException:
            _unlink_name(name, os.getpid())
            raise
        finally:
            os.close(fd)
        block = Block(name, mm, owner=True)
        _HEAD.pack_into(block.buf, 0, _MAGIC, 0, -1, 0, 0, b"")
        return block
    raise FileExistsError("no free shared-memory block name in 8 draws")


def attach(name: str) -> Block:
    """Map the block `name` another process created (only posttrain blocks: the name comes from a message)."""
    if not _NAME.fullmatch(name):
        raise ValueError(f"not a posttrain shared-memory block name: {name[:80]!r}")
    fd = _posixshmem.shm_open("/" + name, os.O_RDWR, mode=0o600)
    try:
        mm = mmap.mmap(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)
    block = Block(name, mm, owner=False)
    try:
        block.header()
    except ValueError:
        block.close()
        raise
    return block


def read_verified(
    block: Block, copy: Callable[[], T], nbytes: int, tries: int = 3, timeout_s: float = 60.0
) -> tuple[int, T]:
    """Run `copy` (which reads the first `nbytes` of the payload) until one run saw a single version whole: no fill
    started or ran during it and the bytes match the version's digest. Returns (version, what `copy` returned)."""
    why = ""
    for _ in range(max(tries, 1)):
        head = wait_readable(block, nbytes, timeout_s)
        out = copy()
        why = changed_since(block, head)
        if not why:
            return head.version, out
    raise TornReadError(f"shared-memory block {block.name}: {why} during each of {max(tries, 1)} copies")


def wait_readable(block: Block, nbytes: int, timeout_s: float) -> Header:
    """The header once no fill is in progress (at most `timeout_s`); raises when nothing was ever pushed, when the
    layout is not the one pushed, or when the owner died in the middle of a fill."""
    deadline = time.monotonic() + timeout_s
    while (head := block.header()).seq % 2:
        if not _owneralive(block.name):
            raise TornReadError(f"shared-memory block {block.name}: its owner died in the middle of a fill (torn)")
        if time.monotonic() > deadline:
            raise TornReadError(f"shared-memory block {block.name}: a fill did not end within {timeout_s:g}s")
        time.sleep(0.001)
    if head.version < 0:
        raise TornReadError(f"shared-memory block {block.name}: nothing was written to it yet")
    if head.nbytes != nbytes:
        raise ValueError(f"shared-memory block {block.name} holds {head.nbytes} bytes, the layout {nbytes}")
    return head


def changed_since(block: Block, head: Header) -> str:
    """Why a copy made since `head` was read is not that version ("" when it is): a fill began, or the bytes do
    not hash to its digest."""
    if block.header().seq != head.seq:
        return "refilled"
    if block._digest(head.algo, head.nbytes) != head.digest:
        return "torn (its bytes do not match its digest)"
    if block.header().seq != head.seq:  # the hash itself raced a fill
        return "refilled"
    return ""


# ---- names and the sweep ---------------------------------------------------------------------------------------
def new_name() -> str:
    """posttrain_<pid>_<tag><random>: 30 characters at most (macOS allows 31 with the leading slash)."""
    return f"{PREFIX}{os.getpid()}_{ns_tag()}{secrets.token_hex(3)}"


def sweep(directory: str = SHM_DIR) -> list[str]:
    """Remove the blocks of this pid namespace whose owner is no longer alive; returns their names."""
    try:
        names = os.listdir(directory)
    except OSError:  # no /dev/shm to list (macOS): nothing to sweep
        return []
    removed = []
    for name in names:
        if _owneralive(name):  # not a block's name, another namespace's, or its owner lives
            continue
        try:
            _posixshmem.shm_unlink("/" + name)
        except (FileNotFoundError, PermissionError):  # another creator swept it first; another user's
            continue
        removed.append(name)
    return removed


def _owneralive(name: str) -> bool:
    """Whether the block's owner is alive, as far as this process can tell (a pid of another namespace: assumed)."""
    m = _NAME.fullmatch(name)
    return m is None or m.group(2) != ns_tag() or alive(int(m.group(1)))


def _unlink_name(name: str, creator_pid: int) -> None:
    if os.getpid() != creator_pid:  # a forked child exiting: the block is its parent's
        return
    try:
        _posixshmem.shm_unlink("/" + name)
    except FileNotFoundError:
        pass


def _reserve(fd: int, size: int) -> None:
    """All of the block's pages, now (see the module doc); `ShmSpaceError` when /dev/shm has no room for them."""
    fallocate = getattr(os, "posix_fallocate", None)
    if fallocate is None:  # macOS: no reservation, the size alone
        os.ftruncate(fd, size)
        return
    try:
        fallocate(fd, 0, size)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.ENOMEM, errno.EFBIG):
            raise ShmSpaceError(
                f"shared memory ({SHM_DIR}) has no room for the {size / 2**20:.0f} MiB weight block "
                f"({_free_mib()}): {e.strerror}"
            ) from None
        if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise
        os.ftruncate(fd, size)  # a filesystem that cannot reserve: sized only, as before


def _free_mib() -> str:
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return "its free space unknown"
    return f"{st.f_bavail * st.f_frsize / 2**20:.0f} MiB free of {st.f_blocks * st.f_frsize / 2**20:.0f} MiB"


@functools.cache
def _has_xxhash() -> bool:
    try:
        import xxhash  # noqa: F401 - only whether it is there
    except ImportError:
        return False
    return True
