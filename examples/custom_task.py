"""A custom task in ~20 lines: teach the model to answer sums with just the number.

Run it:  posttrain train task.name=examples/custom_task.py:make_task loop.steps=10
"""

import random
import re


def correct_number(completions, answer, **kwargs):
    """TRL-style reward: 1.0 for exactly the right number, 0.5 when the last number in the reply is right."""
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    scores = []
    for text, a in zip(texts, answer):
        numbers = re.findall(r"-?\d+", text)
        exact = re.fullmatch(r"\s*-?\d+\s*", text) is not None
        scores.append(0.0 if not numbers or int(numbers[-1]) != a else (1.0 if exact else 0.5))
    return scores


def make_task(n: int = 300, seed: int = 0):
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(1, 50), rng.randint(1, 50)
        rows.append({"prompt": [{"role": "user", "content": f"What is {a} + {b}? Reply with only the number."}],
                     "answer": a + b})
    return {"train": rows[:-40], "eval": rows[-40:], "rewards": [correct_number], "max_tokens": 16}
