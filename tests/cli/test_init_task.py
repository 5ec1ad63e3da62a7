"""`posttrain init task NAME` writes a task file that loads, scores as its smoke checks say, and passes env check."""

import subprocess
import sys

import pytest

from posttrain.envs.smoke_checks import check_task, score_completion
from posttrain.tasks.load import load_task
from posttrain.tasks.scaffold import task_file_text, write_task_file


def _cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "posttrain.cli", *args], capture_output=True, text=True,
                          timeout=300, cwd=cwd)


def test_init_task_then_env_check_passes(tmp_path):
    r = _cli("init", "task", "demo_task", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "demo_task.py").exists() and "posttrain train task.name=demo_task.py:make_task" in r.stdout
    r = _cli("env", "check", "--task", "demo_task.py:make_task", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "demo_task" in r.stdout and "FAIL" not in r.stdout
    # A second init must not clobber the user's edits.
    r = _cli("init", "task", "demo_task", cwd=tmp_path)
    assert r.returncode == 2 and "exists" in r.stderr


def test_generated_task_scores_good_and_bad_and_demonstrates(tmp_path):
    path = write_task_file("my_task", tmp_path)
    task = load_task(f"{path}:make_task")
    assert task.name == "my_task" and len(task.train_rows) == 160 and len(task.eval_rows) == 40
    assert len(task.smoke_checks) == 3 and all(r.ok for r in check_task(task))
    row = task.train_rows[0]
    assert score_completion(task, row, row["answer"]).passed
    assert not score_completion(task, row, f"It opened in {row['answer']}.").passed  # partial credit only
    assert score_completion(task, row, f"It opened in {row['answer']}.").reward == pytest.approx(0.5)
    # The demonstration passes the rubric: a warm start would train on it.
    (reply,) = task.demonstrate(row)
    assert score_completion(task, row, reply).passed
    assert "warm_start.steps" in path.read_text()


def test_bad_names_and_force(tmp_path):
    with pytest.raises(ValueError):
        task_file_text("bad name!")
    write_task_file("t.py", tmp_path)
    with pytest.raises(FileExistsError):
        write_task_file("t", tmp_path)
    assert write_task_file("t", tmp_path, force=True).name == "t.py"
