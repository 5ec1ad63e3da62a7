"""`arith`: small arithmetic questions with integer answers ("What is 7 + 5?"), for test-time RL (docs/ttrl.md).

Labelled (`answer`), so it trains with plain RL too (reward: the last integer in the completion equals the answer),
but it exists for `posttrain ttrl --task arith`, which strips the labels from the training rows and rewards
agreement with the group's majority answer instead.
"""

from __future__ import annotations

import random
import re

from posttrain.envs.smoke_checks import SmokeCheck
from posttrain.envs.task import Task
from posttrain.rewards.rubric import RewardComponent, Rubric
from posttrain.rewards.text import completion_text

_INT = re.compile(r"-?\d+")


def last_integer(text: str) -> str | None:
    """The last integer written in `text`, normalised as str(int(x)) would ("007" -> "7", "-0" -> "0") but on the
    digits themselves: int() refuses more than 4300 digits, and a policy can write 5000 (issue #42)."""
    found = _INT.findall(text)
    if not found:
        return None
    digits = found[-1].lstrip("-").lstrip("0") or "0"
    return "-" + digits if found[-1].startswith("-") and digits != "0" else digits


def correct(completions, answer, **kwargs) -> list[float]:
    return [float(last_integer(completion_text(c)) == str(a)) for c, a in zip(completions, answer)]


def make_task(n_train: int = 64, n_eval: int = 32, seed: int = 0, max_value: int = 20, max_tokens: int = 16) -> Task:
    if n_train < 1 or n_eval < 0:
        raise ValueError(f"arith: need n_train >= 1 and n_eval >= 0, got {n_train}, {n_eval}")
    if max_value < 2:
        raise ValueError(f"arith: max_value must be >= 2, got {max_value}")
    rng = random.Random(f"arith:{seed}")
    ops = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
    seen: set[str] = set()

    def rows(n: int) -> list[dict]:
        out = []
        while len(out) < n:
            a, b, op = rng.randint(0, max_value), rng.randint(0, max_value), rng.choice(list(ops))
            q = f"{a} {op} {b}"
            if q in seen and len(seen) < (max_value + 1) ** 2 * 3:  # train and held-out questions never repeat
                continue
            seen.add(q)
            out.append(
                {
                    "prompt": [{"role": "user", "content": f"What is {q}? Answer with the number only."}],
                    "answer": str(ops[op](a, b)),
                }
            )
        return out

    train_rows, eval_rows = rows(n_train), rows(n_eval)
    r0 = train_rows[0]
    return Task(
        name="arith",
        train_rows=train_rows,
        eval_rows=eval_rows,
        rubric=Rubric([RewardComponent("correct", correct)], pass_component="correct"),
        max_tokens=max_tokens,
        description="integer arithmetic, exact answer",
        smoke_checks=[
            SmokeCheck("the right number passes", row=r0, completion=f"It is {r0['answer']}"),
            SmokeCheck("a wrong number fails", row=r0, completion=f"{int(r0['answer']) + 1}", expect="fail"),
        ],
    )
