"""Rewards for repair tasks graded by a test suite: pay for the tests the issue breaks, not for the rest.

A repair task (fix a bug, restore a deleted function) starts from code that already passes most of the repo's tests.
Paying the share of all tests passed then pays the untouched code, and RL learns to leave it untouched
(docs/results/tasks.md, "Coding agent": held-out reward 0.080 -> 0.712 with no edit applied). SWE-bench splits the tests
in two by the starting code's grade: fail-to-pass (the issue) and pass-to-pass (everything it must not break).
"""

from __future__ import annotations

from dataclasses import dataclass

from posttrain.rewards.rubric import PartialRewardFailure

# the reward a repair task pays: "issue_tests" (issue_score) or "tests_passed" (the share of all tests, forgeable
# by the untouched code; kept for runs measured with it)
REPAIR_REWARDS = ("issue_tests", "tests_passed")


def check_repair_reward(reward: str) -> str:
    if reward not in REPAIR_REWARDS:
        raise ValueError(f"reward must be one of {REPAIR_REWARDS}, got {reward!r}")
    return reward


def issue_score(start: dict[str, bool] | None, now: dict[str, bool] | None) -> float:
    """The share of the tests the starting code fails that now pass (fail-to-pass), times the share of those it
    passed that still pass (pass-to-pass), in [0, 1]; per-test results as GradeResult.per_test gives them.
    Untouched code scores 0 however many unrelated tests pass, and a fix that breaks other code loses that share.
    0 when either grade has no per-test results (a grader error) or the start fails no test (no issue to fix):
    never a fallback a wrong answer could earn."""
    if not start or now is None:
        return 0.0
    f2p = [t for t, ok in start.items() if not ok]
    p2p = [t for t, ok in start.items() if ok]
    if not f2p:
        return 0.0
    fixed = sum(bool(now.get(t)) for t in f2p) / len(f2p)
    kept = sum(bool(now.get(t)) for t in p2p) / len(p2p) if p2p else 1.0
    return fixed * kept


@dataclass(frozen=True)
class Baseline:
    """The starting code's per-test verdicts (GradeResult.per_test), or None with the reason they are unknown
    (its grade timed out or broke, tasks/baselines.py): the split issue_score measures against."""

    per_test: dict[str, bool] | None
    error: str | None = None


def issue_rewards(pairs: list[tuple[Baseline, dict[str, bool] | None] | None], paid: bool) -> list[float | None]:
    """issue_score per sample. `pairs[i]` is None when sample i was not graded (nothing spliced in, never
    submitted): 0, nothing was measured; else (its row's baseline, its own per_test, None when its grade came to
    no verdict: 0, a solution that hangs fails).

    A sample whose baseline is unknown has no measurement, so it is never paid a guess: 0 would punish a real
    fix, and an all-failed baseline paid untouched code 0.5 and more. Where issue_tests is the reward (`paid`)
    those samples raise PartialRewardFailure: the rubric marks them failed with the error, the trainer leaves
    them out and the loop counts them, while the batch's other samples keep their values. Logged only (another
    component is paid): None, "does not apply", so the sample's paid reward stands."""
    values: list[float | None] = []
    errors: dict[int, str] = {}
    for i, pair in enumerate(pairs):
        if pair is None:
            values.append(0.0)
        elif pair[0].per_test is None:
            values.append(None)
            errors[i] = f"baseline unknown, nothing to measure against: {pair[0].error or 'not graded'}"
        else:
            values.append(issue_score(pair[0].per_test, pair[1]))
    if errors and paid:
        raise PartialRewardFailure(values, errors)
    return values
