"""Fixtures for sandbox tests: backend parametrization and a host-state guard checked after every test."""

import atexit
import os
import shutil
import subprocess
import tempfile

import pytest
from sbhelpers import MARK

from posttrain.sandbox import SandboxConfig, probe_backends
from posttrain.sandbox import run as run_mod
from posttrain.sandbox.limits import processes_of_uid

# Our runs stage under their own dir, so other sandbox users on this machine cannot confuse the leftover check.
STAGING = tempfile.mkdtemp(prefix="ptsb-tests-")
atexit.register(shutil.rmtree, STAGING, True)
WATCHED_DIRS = ["/etc", "/usr", "/usr/bin", "/usr/lib", "/usr/local", "/usr/local/bin", "/root"]


@pytest.fixture(autouse=True)
def _torch_threads():
    """Overrides the repo-wide fixture: these tests never touch torch, and importing it costs seconds."""
    yield


def _listing(path):
    try:
        return set(os.listdir(path))
    except OSError:
        return set()


def _marked_processes():
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if MARK.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found


@pytest.fixture(autouse=True)
def host_guard(monkeypatch, tmp_path):
    """Plant a secret, record every uid the sandbox hands out, and check the host afterwards:
    the secret is intact, no new entries in system dirs, no staging dirs or MARK files left in /tmp,
    no process of any run's uid and no process carrying MARK still alive, a sentinel host process alive, no cgroup
    or mount of a run left."""
    secret = tmp_path / "host_secret.txt"
    secret.write_text(f"TOPSECRET-{MARK}")
    before = {d: _listing(d) for d in WATCHED_DIRS}
    uids = []
    real_allocate = run_mod.allocate_uid

    def recording_allocate():
        uid = real_allocate()
        uids.append(uid)
        return uid

    monkeypatch.setattr(run_mod, "allocate_uid", recording_allocate)
    cgroup_dirs = []
    real_create = run_mod.RunCgroup.create

    def recording_create(*a, **k):
        cg = real_create(*a, **k)
        cgroup_dirs.extend(cg.dirs)
        return cg

    monkeypatch.setattr(run_mod.RunCgroup, "create", recording_create)
    sentinel = subprocess.Popen(["sleep", "120"])
    try:
        yield {"secret": secret, "uids": uids, "sentinel": sentinel}
    finally:
        alive = sentinel.poll() is None
        sentinel.kill()
        sentinel.wait(timeout=5)
    assert alive, "a host process was killed by sandboxed code"
    assert secret.read_text() == f"TOPSECRET-{MARK}"
    for d in WATCHED_DIRS:
        new = _listing(d) - before[d]
        assert not {n for n in new if MARK in n or "pwn" in n}, f"new files in {d}: {new}"
    assert not [n for n in _listing("/tmp") if MARK in n or "pwn" in n]
    assert not _listing(STAGING), f"staging dirs left behind: {_listing(STAGING)}"
    survivors = {u: processes_of_uid(u) for u in uids}
    assert not any(survivors.values()), f"processes of sandbox uids survived: {survivors}"
    assert not _marked_processes(), "a marked process survived"
    assert not [d for d in cgroup_dirs if os.path.exists(d)], "a run's cgroup was left behind"
    with open("/proc/self/mountinfo") as f:
        assert STAGING not in f.read(), "a run's staging mount was left behind"


def _backend_params():
    reasons = probe_backends()
    out = []
    for b in ("bwrap", "unshare"):
        marks = [] if reasons[b] is None else [pytest.mark.skip(reason=f"{b} unavailable here: {reasons[b]}")]
        out.append(pytest.param(b, marks=marks, id=b))
    return out


@pytest.fixture(params=_backend_params())
def cfg(request):
    """A tight config per isolating backend. The tests that are about a timeout set their own short one; this
    default only bounds the runs that are meant to finish, and is generous because `make test` runs two pytest
    workers on two cores (an out-of-process grade is two interpreters besides them): at 2 s, four such runs timed
    out in a fresh-clone CI under that load."""
    return SandboxConfig(backend=request.param, staging_dir=STAGING, timeout_s=20.0, case_timeout_s=10.0,
                         max_output_bytes=4096)
