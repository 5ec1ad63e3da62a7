"""What keeps the test suite hermetic (tests/conftest.py wires it in): every cache, the judge's verdicts, run
folders and anything a library keeps under `~` go to one temporary root for the whole session (shared by the xdist
workers through the environment they inherit), and the converted default model is the one input read from the
user's own cache. At the end the user's real home is searched for anything the session wrote, and `/dev/shm` and the
process table for anything it left behind; either fails the session.

Why: the suite read and wrote `~/.cache/posttrain/judge_cache.sqlite`, so verdicts cached by earlier runs answered
the judge and the suite passed only on the machine that had them (40 tests failed on a fresh one)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT_VAR = "POSTTRAIN_TEST_ROOT"
SESSION_VAR = "POSTTRAIN_TEST_SESSION"
# Caches and homes that libraries the tests drive may write to; each is pointed inside the session's root.
REDIRECTED = {
    "HOME": "home",
    "XDG_CACHE_HOME": "home/.cache",
    "XDG_CONFIG_HOME": "home/.config",
    "XDG_DATA_HOME": "home/.local/share",
    "POSTTRAIN_CACHE": "posttrain-cache",
    "POSTTRAIN_JUDGE_CACHE": "posttrain-cache/judge_cache.sqlite",
    "HF_HOME": "home/.cache/huggingface",
    "MPLCONFIGDIR": "home/.config/matplotlib",
    "TRACKIO_DIR": "home/.cache/trackio",
    "WANDB_DIR": "home/wandb",
}


@dataclass(frozen=True)
class Session:
    root: Path  # the session's temporary root
    real_home: Path  # the user's home, never written
    models: Path  # the converted models: the one shared input
    started: float
    shm_before: frozenset[str]
    owner: bool  # this process made the root: it checks and removes it at the end (not xdist workers, nested runs)


def real_models_dir() -> Path:
    from posttrain.models.default import models_dir

    return models_dir()


def enter() -> Session:
    """Point every cache at the session's root (made once, by the first process: the xdist workers inherit it)."""
    real_home = Path(os.environ.get("POSTTRAIN_TEST_REAL_HOME") or os.path.expanduser("~"))
    owner = not os.environ.get(ROOT_VAR)
    if not owner:
        root = Path(os.environ[ROOT_VAR])
    else:
        os.environ["POSTTRAIN_TEST_REAL_HOME"] = str(real_home)
        os.environ["POSTTRAIN_MODELS"] = str(real_models_dir())  # resolved before HOME moves
        root = Path(tempfile.mkdtemp(prefix="posttrain-tests-"))
        os.environ[ROOT_VAR] = str(root)
        os.environ[SESSION_VAR] = root.name
        for var, sub in REDIRECTED.items():
            os.environ[var] = str(root / sub)
        (root / "home" / ".cache").mkdir(parents=True, exist_ok=True)
    return Session(root, real_home, Path(os.environ["POSTTRAIN_MODELS"]), time.time(), frozenset(shm_entries()), owner)


def shm_entries() -> set[str]:
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()


def written_under(home: Path, since: float, skip: list[Path], limit: int = 200_000) -> list[str]:
    """Files under `home` modified at or after `since` (the walk stops after `limit` entries), skipping `skip`."""
    found, seen = [], 0
    skip_s = [str(p) for p in skip]
    for top, dirs, files in os.walk(home):
        dirs[:] = [d for d in dirs if not any(os.path.join(top, d).startswith(s) for s in skip_s)]
        for f in files:
            seen += 1
            path = os.path.join(top, f)
            try:
                if os.lstat(path).st_mtime >= since:
                    found.append(path)
            except OSError:
                continue
        if seen > limit:
            break
    return found


def _parent(pid: str) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[1])


def session_processes(marker: str, exclude: set[int]) -> list[str]:
    """Live processes whose environment carries this session's marker (every process a test started inherits it),
    other than `exclude` and multiprocessing's helper processes of a process in `exclude` (its resource tracker or
    fork server: they live as long as that process, and leave with it)."""
    out = []
    needle = f"{SESSION_VAR}={marker}".encode()
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) in exclude:
            continue
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes()
            if needle in env.split(b"\0"):
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
                helper = "multiprocessing.resource_tracker" in cmd or "multiprocessing.forkserver" in cmd
                if state != "Z" and not (helper and _parent(pid) in exclude):
                    out.append(f"{pid}: {cmd[:160]}")
        except OSError:
            continue
    return out


def leftovers(s: Session, skip: list[Path], grace_s: float = 10.0) -> list[str]:
    """What the session left: files in the real home, new /dev/shm entries, live processes (after a grace period
    for processes that are on their way out)."""
    problems = [f"wrote under the user's home: {p}" for p in written_under(s.real_home, s.started, skip)[:20]]
    deadline = time.monotonic() + grace_s
    while True:
        shm = sorted(shm_entries() - s.shm_before)
        procs = session_processes(s.root.name, {os.getpid()})
        if (not shm and not procs) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    # A POSIX semaphore of a third-party library (joblib/loky's `sem.loky-<pid>-*`, 32 bytes) left by a vLLM
    # server process killed outright: said, not failed on, until its creator is traced (the issue note says so).
    # Everything else in /dev/shm (posttrain's weight blocks, vLLM's broadcast blocks) fails the session.
    small_sems = [n for n in shm if n.startswith("sem.") and _size(n) <= 4096]
    if small_sems:
        print(f"\nnote: semaphores left in /dev/shm by killed third-party processes: {small_sems}", file=sys.stderr)
    problems += [f"left in /dev/shm: {n}" for n in shm if n not in small_sems]
    problems += [f"left running: {p}" for p in procs]
    return problems


def _size(name: str) -> int:
    try:
        return os.stat(os.path.join("/dev/shm", name)).st_size
    except OSError:
        return 0


def leave(s: Session) -> None:
    shutil.rmtree(s.root, ignore_errors=True)
