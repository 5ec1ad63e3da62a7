"""`count-a`: a tiny synthetic task for fast tests. Reward = share of the completion's characters that are 'a'.

A random model writes about 1% 'a'; RL moves that up within seconds on `tiny-random`, which makes this the
task of the end-to-end learning test.
"""

from __future__ import annotations

import random

from posttrain.envs.smoke_checks import SmokeCheck
from posttrain.envs.task import Task
from posttrain.rewards.rubric import RewardComponent, Rubric
from posttrain.rewards.text import completion_text


def a_fraction(completions, **kwargs) -> list[float]:
    out = []
    for c in completions:
        text = completion_text(c)
        out.append(text.count("a") / len(text) if text else 0.0)
    return out


def a_feedback(completions, **kwargs) -> list[str | None]:
    """The words a hint can carry for count-a (tests of hint distillation use it)."""
    return [
        f"only {a_fraction([c])[0]:.0%} of the characters were 'a'; write more of the letter a." for c in completions
    ]


def make_task(n_train: int = 64, n_eval: int = 16, seed: int = 0, max_tokens: int = 16) -> Task:
    rng = random.Random(seed)
    words = ["cat", "dog", "sun", "map", "key", "box", "cup", "pen"]

    def row(i: int) -> dict:
        w = rng.choice(words)
        return {"prompt": [{"role": "user", "content": f"say a {w} {i}"}], "word": w}

    rubric = Rubric(
        [RewardComponent("a_fraction", a_fraction, weight=1.0, pass_threshold=0.5)], pass_component="a_fraction"
    )
    train_rows = [row(i) for i in range(n_train)]
    return Task(
        name="count-a",
        train_rows=train_rows,
        smoke_checks=[
            SmokeCheck("all a passes", row=train_rows[0], completion="aaaa"),
            SmokeCheck("no a fails", row=train_rows[0], completion="xyz", expect="fail"),
        ],
        eval_rows=[row(1000 + i) for i in range(n_eval)],
        rubric=rubric,
        max_tokens=max_tokens,
        feedback=a_feedback,
    )
