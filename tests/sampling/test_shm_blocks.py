"""The shared-memory weight blocks (sampling/shm_blocks.py, through FlatWeights and SharedMemoryWeights): nothing
left in /dev/shm when the owner is killed, a /dev/shm too small for the block refused cleanly instead of SIGBUS,
and a copy torn by a refill never taken as a version."""

from __future__ import annotations

import _posixshmem
import errno
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.errors import PosttrainError
from posttrain.owned import ns_tag
from posttrain.sampling import shm_blocks
from posttrain.sampling import weight_transfer as wt
from posttrain.sampling.weight_ipc import SharedMemoryWeights, SharedWeightsReceiver, WeightSyncError

LINUX_SHM = sys.platform.startswith("linux") and os.path.isdir("/dev/shm")

# Each writer prints its block's name, then pushes without pause until it is killed.
_FLAT_WRITER = """
import torch
from posttrain.sampling import weight_transfer as wt
state = {"w": torch.zeros(1 << 20)}
flat = wt.FlatWeights(wt.engine_specs(state, None), shared=True)
flat.fill(state)
print(flat.name, flush=True)
while True:
    state["w"] += 1
    flat.fill(state)
"""
_IPC_WRITER = """
import threading, torch
from posttrain.sampling.weight_ipc import SharedMemoryWeights
model = torch.nn.Linear(512, 512)
sync = SharedMemoryWeights(model, threading.Lock())
print(sync.block.name, flush=True)
v = 0
while True:
    v += 1
    with torch.no_grad():
        model.weight.add_(1)
    sync.push(v)
"""


def _line(proc: subprocess.Popen, timeout_s: float) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    assert ready, f"the writer printed nothing in {timeout_s:g}s"
    return proc.stdout.readline().strip()


def _next_creator() -> None:
    """What any later run does first: create a block (and close it)."""
    nxt = wt.FlatWeights(wt.engine_specs({"x": torch.zeros(4)}, None), shared=True)
    nxt.close()


@pytest.mark.skipif(not LINUX_SHM, reason="lists /dev/shm")
@pytest.mark.parametrize("writer", [_FLAT_WRITER, _IPC_WRITER], ids=["flat", "ipc"])
def test_a_block_whose_owner_was_killed_mid_push_is_gone_after_the_next_creator(writer):
    # Its own session, killed as a group (what a scheduler, `docker kill` or a CI timeout does): Python's resource
    # tracker, a child of the owner, dies with it and cannot clean up after it.
    proc = subprocess.Popen([sys.executable, "-c", writer], stdout=subprocess.PIPE, text=True, start_new_session=True)
    name = ""
    try:
        name = _line(proc, 120)
        assert name and name in os.listdir("/dev/shm")
        time.sleep(0.3)  # mid-push
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        _next_creator()
        assert name not in os.listdir("/dev/shm")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        if name and os.path.exists(f"/dev/shm/{name}"):  # the failure above must not leave it either
            os.unlink(f"/dev/shm/{name}")


def _can_mount_private_tmpfs() -> bool:
    if not LINUX_SHM or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /dev/shm"], capture_output=True, timeout=30
    )
    return probe.returncode == 0


_TOO_BIG = """
import torch
from posttrain.errors import PosttrainError
from posttrain.sampling import weight_transfer as wt
state = {"w": torch.ones(2 << 20)}  # 8 MiB in float32: twice this /dev/shm
try:
    flat = wt.FlatWeights(wt.engine_specs(state, None), shared=True)
    flat.fill(state)
except PosttrainError as e:
    print("REFUSED", type(e).__name__, e.hint())
    raise SystemExit(3)
print("FILLED")
"""


@pytest.mark.skipif(not _can_mount_private_tmpfs(), reason="needs a private mount namespace (root, unshare)")
def test_a_dev_shm_smaller_than_the_block_is_a_clean_error_not_sigbus():
    # `docker run --shm-size=4m`, without docker: a private mount namespace with a 4 MiB tmpfs over /dev/shm
    # (gone with the process, and whatever is in it).
    cmd = [
        "unshare",
        "-m",
        "sh",
        "-c",
        'mount -t tmpfs -o size=4m tmpfs /dev/shm && exec "$0" -c "$1"',
        sys.executable,
        _TOO_BIG,
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode != -signal.SIGBUS, "the trainer died of SIGBUS filling the block"
    assert r.returncode == 3, (r.returncode, r.stdout, r.stderr[-2000:])
    assert "REFUSED" in r.stdout and "--shm-size" in r.stdout and "cluster.weight_transport=" in r.stdout


def _flat(n: int) -> None:
    wt.FlatWeights(wt.engine_specs({"w": torch.zeros(n)}, None), shared=True).close()


def _ipc(n: int) -> None:
    SharedMemoryWeights(torch.nn.Linear(n, 1), threading.Lock()).close()


@pytest.mark.parametrize("create", [_flat, _ipc], ids=["flat", "ipc"])
def test_no_room_for_the_block_is_refused_at_creation_naming_the_fix(monkeypatch, create):
    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    def mine() -> set[str]:  # this process's blocks (an earlier test's, not yet collected, may still be there)
        return {n for n in os.listdir("/dev/shm") if n.startswith(f"posttrain_{os.getpid()}_")} if LINUX_SHM else set()

    before = mine()
    monkeypatch.setattr(os, "posix_fallocate", full, raising=False)
    with pytest.raises(PosttrainError) as e:
        create(1 << 16)
    assert "--shm-size" in e.value.fix and "cluster.weight_transport=" in e.value.fix
    assert "shared memory" in str(e.value)
    assert mine() <= before  # the refused block is not left behind


def test_a_copy_torn_by_a_refill_is_never_accepted():
    """A writer refills the block (every element = the push's number) while a reader copies it: a copy that mixes
    two pushes must be refused, and what is accepted is one push whole."""
    state = {f"t{i}": torch.zeros(1 << 19) for i in range(4)}  # 8 MiB in four tensors
    specs = wt.engine_specs(state, None)
    flat = wt.FlatWeights(specs, shared=True)
    flat.fill(state)
    name = flat.name
    assert name is not None
    stop = threading.Event()

    def writer() -> None:
        k = 0
        rng = random.Random(0)
        while not stop.is_set():
            k += 1
            for t in state.values():
                t.fill_(k)
            flat.fill(state)
            time.sleep(rng.uniform(0, 0.01))

    th = threading.Thread(target=writer, daemon=True)
    th.start()
    accepted, refused, mixed = 0, 0, []
    try:
        deadline = time.monotonic() + 20
        while accepted < 30 and time.monotonic() < deadline:
            try:
                with wt.shared_views(name, specs) as items:
                    got = torch.cat([t.flatten().clone() for _, t in items])
            except RuntimeError as e:  # refused: the block changed under the copy
                assert "refilled" in str(e) or "torn" in str(e), e
                refused += 1
                continue
            accepted += 1
            values = got.unique()
            if values.numel() != 1:
                mixed.append(values.tolist()[:4])
    finally:
        stop.set()
        th.join(30)
        flat.close()
    assert not mixed, f"{len(mixed)} of {accepted} accepted copies mixed pushes, e.g. {mixed[:3]} ({refused} refused)"
    assert accepted >= 1


# ---- the module's own parts ------------------------------------------------------------------------------------
def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait(timeout=60)
    return p.pid


def _fake_block(name: str) -> None:
    fd = _posixshmem.shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
    os.ftruncate(fd, 4096)
    os.close(fd)


@pytest.mark.skipif(not LINUX_SHM, reason="lists /dev/shm")
def test_the_sweep_removes_only_blocks_of_dead_owners_in_this_pid_namespace():
    tag, dead = ns_tag(), _dead_pid()
    other_tag = f"{(int(tag, 16) + 1) % 0xFFFFFF:06x}"
    dead_here, dead_elsewhere = f"posttrain_{dead}_{tag}a1b2c3", f"posttrain_{dead}_{other_tag}a1b2c3"
    not_ours = f"psm_posttrain_{dead}_{tag}a1b2c3"
    live = shm_blocks.create(16)
    try:
        for n in (dead_here, dead_elsewhere, not_ours):
            _fake_block(n)
        removed = shm_blocks.sweep()
        left = set(os.listdir("/dev/shm"))
        assert dead_here in removed and dead_here not in left
        # a pid of another namespace (a container sharing /dev/shm) and a name not ours are left alone
        assert {dead_elsewhere, not_ours, live.name} <= left
    finally:
        live.close()
        live.unlink()
        for n in (dead_here, dead_elsewhere, not_ours):
            if os.path.exists(f"/dev/shm/{n}"):
                os.unlink(f"/dev/shm/{n}")


@pytest.mark.skipif(not LINUX_SHM, reason="lists /dev/shm")
def test_a_block_left_open_is_removed_at_a_normal_exit():
    code = "from posttrain.sampling import shm_blocks; b = shm_blocks.create(1 << 16); print(b.name)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().startswith("posttrain_") and r.stdout.strip() not in os.listdir("/dev/shm")


def test_only_posttrain_block_names_are_attached():
    for name in ("psm_1234", "../etc/passwd", "posttrain_1_zz", "posttrain_" + "1" * 300):
        with pytest.raises(ValueError, match="not a posttrain"):
            shm_blocks.attach(name)


def _filled(n: int = 4096) -> tuple[wt.FlatWeights, list, str]:
    state = {"w": torch.arange(n, dtype=torch.float32)}
    specs = wt.engine_specs(state, None)
    flat = wt.FlatWeights(specs, shared=True)
    flat.fill(state, version=7)
    assert flat.name is not None
    return flat, specs, flat.name


@given(st.integers(0, 4096 * 4 - 1), st.integers(1, 255))
@settings(max_examples=40, deadline=None)
def test_bytes_changed_outside_a_fill_are_refused_by_their_digest(pos, flip):
    flat, specs, name = _filled()
    try:
        with wt.shared_views(name, specs) as items:  # whole: accepted
            assert torch.equal(dict(items)["w"], torch.arange(4096, dtype=torch.float32))
        flat.data[pos] ^= flip  # no fill: the sequence number does not move, the digest no longer matches
        with pytest.raises(shm_blocks.TornReadError, match="digest"):
            with wt.shared_views(name, specs) as items:
                _ = [t.clone() for _, t in items]
        seen = []
        with pytest.raises(shm_blocks.TornReadError, match="each of 2 copies"):
            wt.load_shared(name, specs, lambda items: seen.append(len(items)), tries=2)
        assert seen == [1, 1]  # copied again, then refused
    finally:
        flat.close()


def test_load_shared_returns_the_version_and_a_fill_that_failed_midway_is_refused():
    flat, specs, name = _filled()
    try:
        assert wt.load_shared(name, specs, lambda items: None) == 7
        assert flat.block is not None
        with pytest.raises(RuntimeError, match="midway"), flat.block.writing(8):  # a fill that raised halfway
            raise RuntimeError("midway")
        t0 = time.monotonic()
        with pytest.raises(shm_blocks.TornReadError, match="did not end"):
            wt.load_shared(name, specs, lambda items: None, timeout_s=0.2)
        assert time.monotonic() - t0 < 20
        flat.fill({"w": torch.ones(4096)})  # the next fill makes it whole again
        assert wt.load_shared(name, specs, lambda items: None) == 2
    finally:
        flat.close()


def test_a_sampler_checks_each_new_versions_digest_once():
    lock = threading.Lock()
    model = torch.nn.Linear(64, 4)
    sync = SharedMemoryWeights(model, lock, timeout_s=1.0, retries=0)
    name, specs = sync.receiver_args()
    recv = SharedWeightsReceiver(name, specs, lock)
    try:
        sync.push(1)
        with recv.guard() as v:
            assert v == 1
        sync._views["weight"][0, 0] += 1  # changed outside a push
        with recv.guard() as v:  # version 1 was checked already: not hashed again on every decode
            assert v == 1
        sync.push(2)
        sync._views["weight"][0, 0] += 1
        with pytest.raises(WeightSyncError, match="digest"), recv.guard():
            pass
    finally:
        recv.close()
        sync.close()
