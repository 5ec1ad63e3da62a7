"""A killed server group leaves nothing in /dev/shm (cluster/group_shm.py): vLLM's broadcast blocks and semaphores,
which only its graceful shutdown removes, were left behind by every server killed outright (13 blocks, 3.0 GB after
one test run). Stand-ins here: a "server" that makes a multiprocessing shared-memory block and a POSIX semaphore, and
a grandchild that maps the block too, as vLLM's engine core and workers do."""

import os
import subprocess
import sys
import time
from pathlib import Path

from posttrain.cluster.group_shm import mapped_by_group, remove_unmapped
from posttrain.cluster.server_processes import kill_group, spawn_supervised

SERVER = r"""
import multiprocessing.synchronize, multiprocessing, sys, time
from multiprocessing import shared_memory
block = shared_memory.SharedMemory(create=True, size=1 << 20)
sem = multiprocessing.get_context("fork").Semaphore()  # a /dev/shm/sem.* file while it is being created
worker = multiprocessing.get_context("fork").Process(target=lambda: time.sleep(600))  # maps the block too
worker.start()
print("up", block.name, flush=True)
time.sleep(600)
"""


def _wait_up(log: Path) -> str:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for line in log.read_text().splitlines():
            if line.startswith("up "):
                return line.split()[1]
        time.sleep(0.1)
    raise AssertionError(f"the stand-in server did not start: {log.read_text()[-2000:]}")


def _wait_gone(path: Path, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while path.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    return not path.exists()


def test_a_killed_group_leaves_no_shared_memory(tmp_path):
    log = tmp_path / "server.log"
    server = spawn_supervised([sys.executable, "-c", SERVER], dict(os.environ), tmp_path / "s0-0.sock", log)
    block = Path("/dev/shm") / _wait_up(log)
    assert block.exists() and str(block) in mapped_by_group(server.pgid)
    kill_group(server, grace_s=2)
    assert not block.exists(), "the killed group's shared-memory block is still in /dev/shm"


TRAINER = r"""
import os, sys, time
from pathlib import Path
from posttrain.cluster.server_processes import spawn_supervised
tmp = Path(sys.argv[1])
spawn_supervised([sys.executable, "-c", sys.argv[2]], dict(os.environ), tmp / "s0-0.sock", tmp / "server.log")
time.sleep(600)
"""


def test_a_trainer_killed_outright_leaves_no_shared_memory_of_its_servers(tmp_path):
    """SIGKILL runs no cleanup in the trainer: the watchdog, seeing it gone, removes what its group mapped."""
    trainer = subprocess.Popen([sys.executable, "-c", TRAINER, str(tmp_path), SERVER])
    try:
        log = tmp_path / "server.log"
        deadline = time.monotonic() + 30
        while not log.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        block = Path("/dev/shm") / _wait_up(log)
        trainer.kill()
        trainer.wait(timeout=10)
        assert _wait_gone(block, within_s=30), "the dead trainer's server left its block in /dev/shm"
    finally:
        if trainer.poll() is None:
            trainer.kill()
            trainer.wait()


def test_what_a_live_process_maps_or_posttrain_owns_is_kept(tmp_path):
    from multiprocessing import shared_memory

    block = shared_memory.SharedMemory(create=True, size=4096)
    try:
        path = f"/dev/shm/{block.name}"
        assert remove_unmapped({path}) == []  # this process maps it
        assert os.path.exists(path)
    finally:
        block.close()
        block.unlink()
    assert all(not os.path.basename(n).startswith("posttrain_") for n in mapped_by_group(os.getpgid(0)))


def test_a_group_killed_all_at_once_leaves_no_shared_memory(tmp_path):
    """The whole group SIGKILLed at once (the OOM killer, a test's killpg): nothing of it is left to ask what it
    mapped, so what it was seen to map once up (vllm_server_launch.wait_ready) is removed when the pool reaps it."""
    import signal

    log = tmp_path / "server.log"
    server = spawn_supervised([sys.executable, "-c", SERVER], dict(os.environ), tmp_path / "s0-0.sock", log)
    block = Path("/dev/shm") / _wait_up(log)
    server.shm |= mapped_by_group(server.pgid)  # what wait_ready records
    os.killpg(server.pgid, signal.SIGKILL)
    server.proc.wait(timeout=10)
    assert block.exists()  # nobody of the group lived to remove it
    kill_group(server, grace_s=2)  # the pool's restart reaps the dead server
    assert not block.exists()
