"""Supervised server processes (cluster/server_processes.py): a killed group leaves nothing behind, whatever its
server forked. (The pool's weights-file lock is sampling/weight_gate.py's WeightGate, tested there.)"""

import os
import sys
import time

import pytest

from posttrain.cluster.server_processes import close_servers, free_port, kill_group, log_tail, spawn_supervised


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
    server = spawn_supervised([sys.executable, "-c", code], dict(os.environ), free_port(), log)
    deadline = time.monotonic() + 20
    while "up" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert server.alive() and "up" in log_tail(log) and log.read_text().startswith("$ ")
    kill_group(server, grace_s=5)
    assert server.killed and not server.alive() and _gone(server.pgid)
    kill_group(server)  # idempotent: a killed group's id is never signalled again


def test_close_servers_kills_every_group_at_once(tmp_path):
    servers = [spawn_supervised([sys.executable, "-c", "import time; time.sleep(600)"], dict(os.environ), free_port(),
                                tmp_path / f"s{i}.log") for i in range(2)]
    close_servers(servers)
    assert all(_gone(s.pgid) for s in servers)
