"""A custom task in ~20 lines: read a sentence and answer with just the year in it.

    posttrain train task.name=examples/custom_task.py:make_task loop.steps=15

Why this one learns in minutes (docs/first_task.md): RL can only raise a reward that already fires sometimes.
The headline (`exact`, the first function: the pass) fires on about one sample in ten of the untrained 135M
model, and `has_year` pays for the right year inside a wordy reply, so a near miss beats a wrong number, and
pays less the wordier the reply, so a group of right-but-wordy replies still has a direction to go. The
plain-text `Q: ... A:` prompt (no chat template) and the stop at a newline keep the answer one short line.
"""

import random

NAMES, PLACES = ["Ada", "Bo", "Cyrus", "Dina", "Eli", "Fay", "Gus", "Hana"], ["bridge", "library", "museum", "tower"]


def exact(completions, answer, **kwargs):
    """The headline: 1.0 when the reply is the year and nothing else."""
    return [1.0 if c.strip().rstrip(".") == str(a) else 0.0 for c, a in zip(completions, answer)]


def has_year(completions, answer, **kwargs):
    """Shaping: the right year somewhere in the reply, worth less the wordier the reply (1/words)."""
    return [1.0 / len(c.split()) if str(a) in c else 0.0 for c, a in zip(completions, answer)]


def make_task(n: int = 200, seed: int = 0):
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        year, visits = rng.randint(1800, 2020), rng.randint(2, 40)  # the visit count is a distractor number
        text = f"{rng.choice(NAMES)} visited the {rng.choice(PLACES)} {visits} times after it opened in {year}."
        rows.append({"prompt": f"{text}\nQ: In which year did it open?\nA:", "answer": year})
    return {"train": rows[:-40], "eval": rows[-40:], "rewards": [exact, has_year], "max_tokens": 12, "stop": ["\n"]}
