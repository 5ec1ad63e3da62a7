"""The docs cannot rot: every `posttrain train` command the README and the examples show is the one
bench/examples.py measures, and each runs as written (in smoke mode: tiny-random, one step)."""

import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ["model.name=tiny-random", "loop.steps=1", "loop.eval_prompts=2", "logging.tensorboard=false",
         "loop.save_every=0", "model.threads=1"]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_examples", ROOT / "bench" / "examples.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _doc_commands(text: str) -> set[str]:
    return {" ".join(m.split()) for m in re.findall(r"posttrain train task\.name=examples/[^\n#`]*", text)}


def test_readme_and_docstrings_show_the_benchmarked_commands():
    commands = set(_bench().COMMANDS.values())
    # The examples bench/examples.py measures (stall_tasks.py is measured by bench/remedy_stall.py).
    measured = tuple(f"task.name=examples/{name}.py:" for name in _bench().COMMANDS)
    readme = {c for c in _doc_commands((ROOT / "README.md").read_text()) if any(m in c for m in measured)}
    assert readme, "the README shows no example command"
    assert readme <= commands, f"README commands not measured by bench/examples.py: {readme - commands}"
    for name, cmd in _bench().COMMANDS.items():
        doc = (ROOT / "examples" / f"{name}.py").read_text().split('"""')[1]
        assert cmd in " ".join(doc.split()), f"examples/{name}.py's docstring does not show {cmd!r}"
        assert cmd in readme, f"the README does not show {cmd!r}"


@pytest.mark.parametrize("name", ["custom_task", "tool_task"])
def test_documented_command_runs_in_smoke_mode(name, tmp_path):
    argv = shlex.split(_bench().COMMANDS[name])
    assert argv[:2] == ["posttrain", "train"]
    over = [a if not a.startswith("warm_start.steps=") else "warm_start.steps=1" for a in argv[2:]]
    over = [a for a in over if not a.startswith("loop.steps=")]
    r = subprocess.run([sys.executable, "-m", "posttrain.cli", "train", *over, *SMOKE,
                        f"run.output_dir={tmp_path}"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "held-out" in r.stdout and "pass_rate" in r.stdout
    assert list(tmp_path.glob("*/summary.json"))


def test_broken_env_example_fails_env_check_as_documented():
    r = subprocess.run([sys.executable, "-m", "posttrain.cli", "env", "check", "--task",
                        "examples/broken_env.py:make_task"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and "FAIL" in r.stdout, r.stdout + r.stderr
