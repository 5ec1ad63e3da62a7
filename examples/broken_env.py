"""A deliberately broken environment, to show that `posttrain env check` (and training) catch it.

    posttrain env check --task examples/broken_env.py:make_task      # exit 1, a red FAIL row

The grader has an off-by-one bug, so the known-good answer scores 0. Declaring one known-good and one
known-bad answer per task (`Task.smoke_checks`) is how a bug like this is caught before hours of training.
"""

from posttrain.envs.smoke_checks import SmokeCheck
from posttrain.tasks.load import to_task


def correct_sum(completions, a, b, **kwargs):
    return [1.0 if c[0]["content"].strip() == str(x + y + 1) else 0.0  # BUG: + 1
            for c, x, y in zip(completions, a, b)]


def make_task():
    rows = [{"prompt": [{"role": "user", "content": f"What is {x} + {y}? Reply with the number."}], "a": x, "b": y}
            for x in range(1, 9) for y in range(1, 9)]
    task = to_task({"train": rows[:-8], "eval": rows[-8:], "rewards": [correct_sum], "max_tokens": 8}, "broken-sum")
    row = rows[0]
    task.smoke_checks = [SmokeCheck("known-good answer passes", row=row, completion=str(row["a"] + row["b"])),
                         SmokeCheck("known-bad answer fails", row=row, completion="0", expect="fail")]
    return task
