"""`posttrain init task NAME`: write a runnable task file a new user edits into their own task.

The file is the pattern of examples/custom_task.py with everything a first task needs spelled out: rows, a
headline reward and a partial-credit one (TRL signature), an optional `demonstrate` hook for a warm start,
smoke checks (a known-good and a known-bad answer) and the commands to check and train it. It passes
`posttrain env check` as written, so the first thing a user sees is green, and every later red row is theirs.

    task_file_text(name) -> str          the file's text (pure)
    write_task_file(name, directory, force=False) -> Path
"""

from __future__ import annotations

import re
from pathlib import Path

_TEMPLATE = '''"""{name}: a posttrain task. Edit the rows and the rewards, then run, from this folder:

    posttrain env check --task {file}:make_task               # known-good passes, known-bad fails
    posttrain env check --task {file}:make_task --preflight   # will the model learn? verdicts with advice
    posttrain train task.name={file}:make_task loop.steps=15

The first reward function is the headline: a sample passes when it scores >= 1.0. The others only shape the
reward. Give partial credit that a near miss earns: a reward that never fires teaches nothing (see
docs/first_task.md). If the preflight says "no learning signal", add `warm_start.steps=20` to the train command
(it imitates `demonstrate` before RL).
"""

import random

from posttrain.envs.smoke_checks import SmokeCheck
from posttrain.tasks.load import to_task


def make_rows(n, seed):
    """Your prompts. A row is a `prompt` (a string is sent as plain text; a list of chat messages goes through
    the model's chat template) plus any columns your reward functions read (here `answer`)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        year, floors = rng.randint(1800, 2020), rng.randint(2, 40)
        text = f"The tower has {{floors}} floors and opened in {{year}}."
        rows.append({{"prompt": f"{{text}}\\nQ: In which year did it open?\\nA:", "answer": str(year)}})
    return rows


def _text(completion):
    # String prompts give string completions; chat prompts give a list of messages (TRL's formats).
    return completion if isinstance(completion, str) else completion[-1]["content"]


def exact(completions, answer, **kwargs):
    """Headline, TRL signature: one score per completion; each dataset column arrives as a list."""
    return [1.0 if _text(c).strip().rstrip(".") == a else 0.0 for c, a in zip(completions, answer)]


def contains(completions, answer, **kwargs):
    """Partial credit: the right answer somewhere in a wordy reply beats a wrong one."""
    return [0.5 if a in _text(c) else 0.0 for c, a in zip(completions, answer)]


def demonstrate(row):
    """Optional: a good reply for a row, used by the supervised warm start (warm_start.steps=N)."""
    return [row["answer"]]


def make_task(n: int = 200, seed: int = 0):
    rows = make_rows(n, seed)
    task = to_task({{"train": rows[:-40], "eval": rows[-40:], "rewards": [exact, contains], "max_tokens": 12,
                    "stop": ["\\n"], "demonstrate": demonstrate}}, "{name}", seed)
    # Run by `posttrain env check` and before training: a grader that passes everything, or fails the right
    # answer, is caught here instead of as a flat reward curve an hour later.
    task.smoke_checks = [
        SmokeCheck("the right answer passes", row=rows[0], completion=rows[0]["answer"], expect="pass"),
        SmokeCheck("a wordy right answer does not pass", row=rows[0], completion=f"It opened in {{rows[0]['answer']}}.",
                   expect="fail"),
        SmokeCheck("a wrong answer does not pass", row=rows[0], completion="1066", expect="fail"),
    ]
    return task
'''


def task_file_name(name: str) -> str:
    return name if name.endswith(".py") else f"{name}.py"


def task_file_text(name: str) -> str:
    """The text of a runnable task file for a task called `name` (a file name, with or without .py)."""
    stem = task_file_name(name)[:-3]
    if not stem or not re.fullmatch(r"[A-Za-z0-9_.-]+", Path(stem).name):
        raise ValueError(f"task name {name!r}: use letters, digits, '_', '-' or '.'")
    return _TEMPLATE.format(name=Path(stem).name, file=Path(task_file_name(name)).name)


def write_task_file(name: str, directory: str | Path = ".", force: bool = False) -> Path:
    """Write NAME.py into `directory`. An existing file is left alone unless `force` (it may be the user's work)."""
    text = task_file_text(name)
    path = Path(directory) / Path(task_file_name(name)).name
    if path.exists() and not force:
        raise FileExistsError(f"{path} exists; pick another name or pass --force to overwrite it")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path
