"""Sampling metrics of an eval: pass@k by the unbiased estimator, and majority voting (maj@k).

With n samples of a prompt of which c pass, the chance that k samples drawn without replacement hold at least one
pass is

    pass@k = 1 - C(n - c, k) / C(n, k)                      (Chen et al. 2021's unbiased estimator)

computed as a product so it stays exact for large n. pass@1 is c / n (the mean over the samples). maj@k: the
answer most samples gave (ties broken by the first seen) is the prompt's answer; the prompt counts as right when
that answer's samples passed. Answers compare after extraction (rewards/extract.py); a sample without an answer
votes for nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimate of pass@k from n samples with c passes (k <= n)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    miss = 1.0
    for i in range(n - c + 1, n + 1):  # C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k / i)
        miss *= 1.0 - k / i
    return 1.0 - miss


def majority_correct(answers: Sequence[str | None], passed: Sequence[bool]) -> bool:
    """Whether the majority answer is a passing one: its samples passed (all of them, in a consistent grader; any
    one is taken so a flaky grader does not flip the vote)."""
    if len(answers) != len(passed):
        raise ValueError(f"{len(answers)} answers for {len(passed)} pass flags")
    votes = Counter(a for a in answers if a is not None)
    if not votes:
        return False
    top = max(votes.values())
    winner = next(a for a in answers if a is not None and votes[a] == top)  # first seen among the tied
    return any(p for a, p in zip(answers, passed) if a == winner)


def prompt_metrics(passed: Sequence[bool], k: int, answers: Sequence[str | None] | None = None) -> dict[str, float]:
    """pass@1, pass@k and (with answers) maj@k for one prompt's samples."""
    n, c = len(passed), sum(bool(p) for p in passed)
    out = {"pass@1": c / n if n else 0.0, f"pass@{k}": pass_at_k(n, c, k) if n else 0.0}
    if answers is not None:
        out[f"maj@{n}"] = float(majority_correct(answers, passed))
    return out


def suite_metrics(per_prompt: Sequence[dict[str, float]]) -> dict[str, float]:
    """The mean of each per-prompt metric over the prompts."""
    if not per_prompt:
        return {}
    keys = list(per_prompt[0])
    return {key: sum(p[key] for p in per_prompt) / len(per_prompt) for key in keys}
