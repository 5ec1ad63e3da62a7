"""`posttrain train --dry-run` refuses what the run would refuse at its start (cli/train_cmds.py through
loop/start_checks.py, the same functions the run calls): the data (it opens, it has the columns), every reward and
its options, loop.best_metric, mixture parts and eval-suite tasks, each in one `error:` line, exit 2, no traceback."""

from __future__ import annotations

import json
import subprocess
import sys

import yaml
from typer.testing import CliRunner

from posttrain.cli import app

runner = CliRunner()
MATH = "task.rewards=[{fn: math}]"


def _jsonl(tmp_path):
    p = tmp_path / "math.jsonl"
    p.write_text("".join(json.dumps({"question": f"{i} + {i}?", "answer": str(2 * i)}) + "\n" for i in range(20)))
    return p


def _refused(*args: str) -> str:
    """The error line a refused dry run prints (its stderr, plus the fix line when the error has one)."""
    r = runner.invoke(app, ["train", "--dry-run", *args])
    out = r.stdout + r.stderr
    assert r.exit_code == 2, out
    assert isinstance(r.exception, SystemExit) and "Traceback" not in out, out
    errors = [line for line in r.stderr.splitlines() if not line.startswith("  fix: ")]
    assert len(errors) == 1 and errors[0].startswith("error: "), r.stderr
    assert r.stdout == "", r.stdout  # no config printed for a run that would not start
    return errors[0]


def test_a_dataset_that_does_not_exist(tmp_path):
    missing = tmp_path / "none.jsonl"
    assert _refused(f"task.dataset={missing}", MATH) == f"error: task.dataset {missing}: no such file or folder"


def test_a_dataset_without_the_prompt_column(tmp_path):
    line = _refused(f"task.dataset={_jsonl(tmp_path)}", MATH)
    assert "has no column 'prompt' (task.prompt_column); its columns: question, answer" in line


def test_a_reward_option_that_does_not_exist(tmp_path):
    line = _refused(f"task.dataset={_jsonl(tmp_path)}", "task.prompt_column=question",
                    "task.rewards=[{fn: math, answer: answer}]")
    assert line == ("error: invalid config: task.rewards[0].answer: unknown option (did you mean 'answer_format'?); "
                    "its options: answer_column, answer_format, timeout_s, batch_timeout_s, max_answer_chars"), line


def test_a_misspelled_best_metric(tmp_path):
    line = _refused(f"task.dataset={_jsonl(tmp_path)}", "task.prompt_column=question", MATH,
                    "loop.best_metric=eval/pass_rte")
    assert line.startswith("error: loop.best_metric 'eval/pass_rte' is not a metric the held-out eval writes; "
                           "did you mean 'eval/pass_rate'?"), line


def test_a_bad_mixture_part_and_a_bad_eval_suite_task():
    line = _refused("task.name=mixture", "task.options.tasks=[{name: count-a}, {name: no-such-task}]")
    assert "unknown task 'no-such-task'" in line
    assert "unknown task 'cout-a'" in _refused("eval_suite.tasks=[{name: cout-a}]")


def test_a_good_config_prints_the_resolved_config_and_what_it_checked(tmp_path):
    r = runner.invoke(app, ["train", "--dry-run", f"task.dataset={_jsonl(tmp_path)}", "task.prompt_column=question",
                            MATH, "loop.best_metric=eval/pass/math"])
    assert r.exit_code == 0, r.stdout + r.stderr
    cfg = yaml.safe_load(r.stdout)
    assert cfg["loop"]["best_metric"] == "eval/pass/math"
    assert "# checked: task dataset:math (18 train / 2 held-out rows; rewards math)" in r.stdout


def test_the_real_command_line_refuses_a_misspelled_best_metric_in_one_line():
    r = subprocess.run([sys.executable, "-m", "posttrain.cli", "train", "--dry-run", "task.name=count-a",
                        "loop.best_metric=eval/passrate"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr and r.stdout == "", r.stderr
    first = r.stderr.splitlines()[0]
    assert first.startswith("error: loop.best_metric 'eval/passrate' is not a metric the held-out eval writes; did "
                            "you mean 'eval/pass_rate'? (it writes "), r.stderr
    assert "eval/pass/" in first, first


def test_task_options_and_eval_suite_values_the_models_refuse():
    """The values the hand-written checks refused (a mixture part, reasoning-gym's and verifiers' own options, an
    eval-suite task, its answer format), refused by the config's models: the key path and what is allowed."""
    line = _refused("task.name=mixture", "task.options.tasks=[{name: count-a, wieght: 2}]")
    assert line.startswith("error: invalid config: task.options.tasks[0].wieght: unknown key (did you mean 'weight'?)")
    line = _refused("task.name=reasoning_gym:leg_counting", "task.options.answer_format=boxd")
    assert "task.options.answer_format: 'boxd': Input should be 'auto'" in line and "did you mean 'boxed'" in line
    assert "task.options.episode_threads: 0: " in _refused("task.name=verifiers:x", "task.options.episode_threads=0")
    assert "eval_suite.tasks[0].promts: unknown key" in _refused("eval_suite.tasks=[{name: count-a, promts: 2}]")
    line = _refused("eval_suite.answer_format=last_word")
    assert "eval_suite.answer_format: 'last_word': Input should be 'auto', 'answer_tag'" in line, line
