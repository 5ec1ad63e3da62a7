"""A custom task in ~20 lines: teach the model to answer arithmetic with just the number.

Run it:  posttrain train task.name=examples/custom_task.py:make_task loop.steps=10
"""

import random
import re


def correct_number(completions, answer, **kwargs):
    """TRL-style reward: 1.0 when the reply is exactly the right number."""
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [1.0 if re.fullmatch(r"\s*-?\d+\s*", t) and int(t) == a else 0.0 for t, a in zip(texts, answer)]


def make_task(n: int = 300, seed: int = 0):
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(1, 50), rng.randint(1, 50)
        rows.append({"prompt": [{"role": "user", "content": f"What is {a} + {b}? Reply with only the number."}],
                     "answer": a + b})
    return {"train": rows[:-40], "eval": rows[-40:], "rewards": [correct_number], "max_tokens": 8}
