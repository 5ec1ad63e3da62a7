"""Supervised server processes (cluster/server_processes.py): a killed group leaves nothing behind, whatever its
server forked, and a trainer killed outright leaves neither its servers nor their sockets' directory. (The pool's
weights-file lock is sampling/weight_gate.py's WeightGate, tested there.)"""

import os
import subprocess
import sys
import time
from pathlib import Path

from posttrain.cluster.server_processes import close_servers, kill_group, log_tail, spawn_supervised


def _gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return True
    return False


def test_a_supervised_command_and_what_it_forked_die_with_its_group(tmp_path):
    # the "server" forks a grandchild that would outlive it if only the server were killed
    code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); " \
           "print('up', flush=True); time.sleep(600)"
    log = tmp_path / "server.log"
    server = spawn_supervised([sys.executable, "-c", code], dict(os.environ), tmp_path / "s0-0.sock", log)
    deadline = time.monotonic() + 20
    while "up" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert server.alive() and "up" in log_tail(log) and log.read_text().startswith("$ ")
    kill_group(server, grace_s=5)
    assert server.killed and not server.alive() and _gone(server.pgid)
    kill_group(server)  # idempotent: a killed group's id is never signalled again


def test_close_servers_kills_every_group_at_once(tmp_path):
    servers = [spawn_supervised([sys.executable, "-c", "import time; time.sleep(600)"], dict(os.environ),
                                tmp_path / f"s{i}-0.sock", tmp_path / f"s{i}.log") for i in range(2)]
    close_servers(servers)
    assert all(_gone(s.pgid) for s in servers)


# A trainer: it makes the pool's private directory, starts a server under the watchdog, says where both are, and
# waits to be killed.
TRAINER = """
import sys, time
from posttrain.cluster.server_processes import spawn_supervised
from posttrain.cluster.server_sockets import SocketDir
sockets = SocketDir.create()
server = spawn_supervised([sys.executable, "-c", "import time; time.sleep(600)"], {}, sockets.socket_for(0, 0),
                          sockets.path / "server.log", private_dir=sockets.path)
print(sockets.path, server.pgid, flush=True)
time.sleep(600)
"""


def test_a_trainer_killed_outright_leaves_no_server_and_no_socket_directory():
    """SIGKILL runs no finalizer: the watchdog, seeing its trainer gone, removes the directory and kills the group."""
    trainer = subprocess.Popen([sys.executable, "-c", TRAINER], stdout=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        line = trainer.stdout.readline().split()
        private, pgid = Path(line[0]), int(line[1])
        assert private.is_dir() and not _gone(pgid)
    finally:
        trainer.kill()
        trainer.wait(10)
        trainer.stdout.close()
    deadline = time.monotonic() + 30  # the watchdog looks once a second
    while (private.exists() or not _gone(pgid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not private.exists() and _gone(pgid)
