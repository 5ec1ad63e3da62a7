"""What a process leaves on the host is removed when it was killed outright (posttrain/owned.py): the next process
that makes a directory of the same kind sweeps the dead owner's. The in-process vLLM engine's work folder (a written
model folder of hundreds of MB) was removed only at a normal exit; a killed run left it in /tmp for good."""

import os
import subprocess
import sys
from pathlib import Path

from posttrain.owned import OwnedDir, alive, sweep_dirs

MAKER = "import sys, time; from posttrain.owned import OwnedDir; d = OwnedDir.create(sys.argv[1], sys.argv[2]); " \
        "(d.path / 'model.safetensors').write_bytes(b'x' * 1000); print(d.path, flush=True); time.sleep(600)"


def test_a_killed_owners_directory_is_swept_by_the_next_one(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", MAKER, "posttrain-test-", str(tmp_path)], stdout=subprocess.PIPE,
                            text=True)
    try:
        left = Path(proc.stdout.readline().strip())
        assert left.is_dir() and oct(left.stat().st_mode & 0o777) == "0o700"
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    assert left.is_dir() and not alive(proc.pid)  # SIGKILL: no finalizer ran
    mine = OwnedDir.create("posttrain-test-", str(tmp_path))
    assert not left.exists() and mine.path.is_dir()
    mine.remove()
    assert not mine.path.exists()


def test_a_live_owner_a_link_and_other_names_are_kept(tmp_path):
    live = OwnedDir.create("posttrain-test-", str(tmp_path))
    (tmp_path / "posttrain-test-999999999-000000-abcdefgh").mkdir()  # another pid namespace's: says nothing here
    (tmp_path / "unrelated").mkdir()
    target = tmp_path / "unrelated"
    os.symlink(target, tmp_path / f"posttrain-test-999999999-{live.path.name.split('-')[3]}-linklink")
    assert sweep_dirs("posttrain-test-", str(tmp_path)) == []
    assert live.path.is_dir() and target.is_dir()
    live.remove()


def test_the_engine_work_folder_is_an_owned_directory():
    from posttrain.sampling import engines

    d = engines.work_dir(None)  # type: ignore[arg-type] - the config is not read
    try:
        assert d.name.startswith(f"posttrain-engine-{os.getpid()}-") and d.is_dir()
    finally:
        engines._WORK_DIRS.pop().remove()
    assert not d.exists()
