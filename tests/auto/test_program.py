"""program.md parsing and validation against the config schema; `posttrain auto` refusing a bad program."""

import subprocess
import sys

import pytest

from posttrain.auto.program import ProgramError, base_data, base_params, load_program


def test_parse_a_valid_program(write_program):
    p, b = write_program(search={"trainer.lr": {"low": "1e-6", "high": 1e-3, "log": True},
                                 "loop.prompts_per_step": {"low": 2, "high": 8},
                                 "algorithm.name": {"choices": ["grpo", "rloo"]},
                                 "task.options.level": [1, 2]},
                         budget={"trial": {"steps": 3, "seconds": 20}, "total": {"trials": 5, "minutes": 10}},
                         set={"loop.eval_every": 1})
    prog = load_program(p, b)
    assert [prog.search[k].kind for k in prog.search] == ["float", "int", "categorical", "categorical"]
    assert prog.search["trainer.lr"].low == 1e-6 and prog.search["trainer.lr"].log
    assert prog.timeout_s == 320  # seconds + 300 when not given
    assert prog.trial_overrides() == ["loop.eval_every=1", "loop.steps=3", "loop.time_budget_s=20.0"]
    assert base_params(prog, base_data(b))["loop.prompts_per_step"] == 4


def test_frozen_key_in_search_is_refused(write_program):
    p, b = write_program(search={"model.name": {"choices": ["tiny-random", "default"]}})
    with pytest.raises(ProgramError, match="'model.name' is frozen"):
        load_program(p, b)


def test_unknown_key_names_the_nearest(write_program):
    p, b = write_program(search={"trainer.lrr": {"low": 1e-6, "high": 1e-3}})
    with pytest.raises(ProgramError, match="did you mean 'trainer.lr'"):
        load_program(p, b)
    p, b = write_program(frozen=["sampling.temprature"])
    with pytest.raises(ProgramError, match="frozen: unknown config key 'sampling.temprature'; did you mean "
                                           "'sampling.temperature'"):
        load_program(p, b)


def test_range_outside_the_schema_is_refused(write_program):
    p, b = write_program(search={"sampling.top_p": {"low": 0.5, "high": 1.5}})
    with pytest.raises(ProgramError, match=r"sampling.top_p high=1.5 is outside what the config schema accepts"):
        load_program(p, b)
    p, b = write_program(search={"algorithm.name": {"choices": ["grpo", "ppo"]}})
    with pytest.raises(ProgramError, match="choice='ppo'"):
        load_program(p, b)


def test_other_mistakes(write_program, tmp_path):
    for over, msg in [({"search": {"run.seed": {"low": 0, "high": 3}}}, "set by posttrain auto"),
                      ({"budget": {"trial": {"steps": 2}}}, "budget.total needs"),
                      ({"search": {"loop.steps": {"low": 1, "high": 3}}}, "set by budget.trial"),
                      ({"serach": {}}, "did you mean 'search'"),
                      ({"search": {"trainer.lr": {"low": 0, "high": 1e-3, "log": True}}}, "log range needs low > 0"),
                      ({"direction": "up"}, "direction must be max or min"),
                      ({"seeds": [1, 1]}, "two different integers")]:
        p, b = write_program(**over)
        with pytest.raises(ProgramError, match=msg):
            load_program(p, b)
    no_yaml = tmp_path / "x.md"
    no_yaml.write_text("# just prose\n")
    with pytest.raises(ProgramError, match="no ```yaml block"):
        load_program(no_yaml)


def test_cli_refuses_a_frozen_key_with_a_clear_error(write_program, tmp_path):
    p, b = write_program(search={"task.name": {"choices": ["count-a", "json-extract"]}})
    r = subprocess.run([sys.executable, "-m", "posttrain.cli", "auto", str(p), str(b), "--out", str(tmp_path / "s")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "'task.name' is frozen" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "s").exists()  # refused before anything is written


def test_the_shipped_example_program_is_valid():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    prog = load_program(root / "examples/auto/program.md", root / "configs/json_extract.yaml")
    assert prog.metric == "eval/pass_rate" and prog.total_minutes == 60 and "model.name" in prog.frozen
    assert base_params(prog, base_data(root / "configs/json_extract.yaml")) == {
        "trainer.lr": 2e-5, "sampling.temperature": 0.7, "algorithm.name": "grpo", "warm_start.steps": 0}
