"""Three tasks built to stall, for `posttrain diagnose` and `diagnostics.remedies` (docs/diagnostics.md).

Each is a plain custom task (`task.name=examples/stall_tasks.py:partial_credit`), written so that the default
model (SmolLM2-135M-Instruct) gets stuck in a known way within a few steps:

- `partial_credit`: a one-word classification. 1.0 for exactly the label, 0.3 for the right label inside a
  sentence. The model always answers in a sentence, so the reward plateaus at 0.3 and the groups stop having
  any variance: "no learning signal", and a headline pass that never fires. Rows carry a `format_hint`
  column, the one sentence a remedy may append to a stalled prompt (it never changes the reward).
- `never_pass`: the first 6 hex digits of a SHA-256, which no small model can compute. A shaping reward
  (6 hex digits at all) moves, the headline pass never fires: "plateau with a pass that never fired".
- `truncated`: count from 1 to 60, with a 24-token budget. Every completion hits the limit: "truncation".
"""

from __future__ import annotations

import hashlib
import random
import re

LABELS = {
    "positive": ["I loved every minute of it", "Absolutely wonderful, would buy again", "Great value and it works",
                 "The staff were kind and the food was superb", "Best purchase I made this year",
                 "It exceeded all my expectations", "Fantastic quality, very happy"],
    "negative": ["It broke after one day", "Terrible service, never again", "A waste of money",
                 "The food was cold and the staff were rude", "Worst hotel I have stayed in",
                 "It stopped working and support ignored me", "Awful, I want a refund"],
}
HINT = "Answer in one word.\nAnswer:"  # base model, T=1.0: 19% of samples pass with it, 1% without


def _text(c) -> str:
    return c[-1]["content"] if isinstance(c, list) else str(c)


def label_reward(completions, label, **kwargs) -> list[float]:
    """1.0 for exactly the label (case and surrounding spaces/punctuation ignored), 0.3 for the right label
    somewhere in a longer reply and not the wrong one, 0 otherwise."""
    out = []
    for c, lab in zip(completions, label):
        text = _text(c).strip().lower()
        other = next(x for x in LABELS if x != lab)
        if re.fullmatch(rf"\W*{lab}\W*", text):
            out.append(1.0)
        elif re.search(rf"\b{lab}\b", text) and not re.search(rf"\b{other}\b", text):
            out.append(0.3)
        else:
            out.append(0.0)
    return out


def partial_credit(n: int = 240, seed: int = 0) -> dict:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        lab = rng.choice(list(LABELS))
        review = rng.choice(LABELS[lab])
        rows.append({"prompt": [{"role": "user", "content": f"What is the sentiment of this review? "
                                 f"Review: \"{review}.\" Label it positive or negative."}],
                     "label": lab, "format_hint": HINT})
    # Stop at the first full stop: the answer is in the first sentence, and short completions keep runs fast.
    return {"train": rows[:-40], "eval": rows[-40:], "rewards": [label_reward], "max_tokens": 32, "stop": ["."]}


WORDS = ["apple", "river", "stone", "cloud", "tiger", "lemon", "piano", "ocean", "maple", "violet", "anchor",
         "candle", "forest", "rocket", "silver", "window", "garden", "pepper", "castle", "bridge"]


def sha_exact(completions, word, **kwargs) -> list[float]:
    """The headline pass: the first 6 hex digits of sha256(word), exactly."""
    return [1.0 if hashlib.sha256(w.encode()).hexdigest()[:6] in _text(c).lower() else 0.0
            for c, w in zip(completions, word)]


def looks_hex(completions, **kwargs) -> list[float]:
    """Shaping: some run of 6 hex digits in the reply (moves with the format, never with the answer)."""
    return [1.0 if re.search(r"\b[0-9a-f]{6}\b", _text(c).lower()) else 0.0 for c in completions]


def never_pass(n: int = 200, seed: int = 0) -> dict:
    rng = random.Random(seed)
    rows = [{"prompt": [{"role": "user", "content": f"What are the first 6 hex digits of the SHA-256 hash of the "
                         f"word '{w}'? Reply with the 6 hex digits."}], "word": w}
            for w in (f"{rng.choice(WORDS)}{rng.randint(0, 99)}" for _ in range(n))]
    return {"train": rows[:-40], "eval": rows[-40:], "rewards": [sha_exact, looks_hex], "weights": [1.0, 0.3],
            "max_tokens": 24}


def count_reward(completions, upto, **kwargs) -> list[float]:
    """Share of 1..upto listed in order at the start of the reply (1.0 only for the whole list)."""
    out = []
    for c, n in zip(completions, upto):
        nums = re.findall(r"\d+", _text(c))
        k = 0
        while k < len(nums) and nums[k] == str(k + 1):
            k += 1
        out.append(min(k, n) / n)
    return out


def truncated(n: int = 120, seed: int = 0, upto: int = 60, max_tokens: int = 24) -> dict:
    rng = random.Random(seed)
    rows = [{"prompt": [{"role": "user", "content": f"Count from 1 to {upto}, separated by commas. "
                         f"({rng.choice(['please', 'thanks', 'go', 'now'])})"}], "upto": upto} for _ in range(n)]
    return {"train": rows[:-24], "eval": rows[-24:], "rewards": [count_reward], "max_tokens": max_tokens}
