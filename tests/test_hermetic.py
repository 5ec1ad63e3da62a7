"""The suite is hermetic (tests/hermetic.py): caches, the judge's verdicts and homes point into the session's
temporary root, and the end-of-session check finds what a test writes under the real home or leaves behind."""

import os
import subprocess
import sys
import time
from pathlib import Path

import hermetic


def test_every_cache_points_into_the_session_root():
    root = Path(os.environ[hermetic.ROOT_VAR])
    real_home = Path(os.environ["POSTTRAIN_TEST_REAL_HOME"])
    assert root.is_dir() and not root.is_relative_to(real_home) or str(real_home) == "/"
    for var in hermetic.REDIRECTED:
        assert Path(os.environ[var]).is_relative_to(root), var
    assert Path(os.path.expanduser("~")).is_relative_to(root)


def test_the_judge_cache_and_the_run_caches_are_not_the_users():
    from posttrain.models.default import cache_dir, models_dir
    from posttrain.rewards.judges.cache import default_cache_path

    root = Path(os.environ[hermetic.ROOT_VAR])
    assert default_cache_path().is_relative_to(root)
    assert cache_dir().is_relative_to(root)
    # the one shared input: the converted default model, in the user's own cache
    assert not models_dir().is_relative_to(root)


def test_a_write_under_home_is_found(tmp_path):
    home, models = tmp_path / "home", tmp_path / "home" / "models"
    (home / ".cache").mkdir(parents=True)
    models.mkdir()
    (home / "old.txt").write_text("before")
    os.utime(home / "old.txt", (time.time() - 100, time.time() - 100))
    since = time.time() - 1
    assert hermetic.written_under(home, since, skip=[models]) == []
    (home / ".cache" / "judge_cache.sqlite").write_text("x")
    (models / "config.json").write_text("{}")  # the shared model folder may be written (first conversion)
    assert hermetic.written_under(home, since, skip=[models]) == [str(home / ".cache" / "judge_cache.sqlite")]


def test_a_process_left_running_is_found():
    marker = os.environ[hermetic.SESSION_VAR]
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert any(p.startswith(f"{child.pid}:") for p in hermetic.session_processes(marker, {os.getpid()}))
    finally:
        child.kill()
        child.wait()
    assert not any(p.startswith(f"{child.pid}:") for p in hermetic.session_processes(marker, {os.getpid()}))
