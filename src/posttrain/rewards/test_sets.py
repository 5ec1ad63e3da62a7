"""Rewards for repair tasks graded by a test suite: pay for the tests the issue breaks, not for the rest.

A repair task (fix a bug, restore a deleted function) starts from code that already passes most of the repo's
tests. Paying the share of all tests passed then pays the untouched code, and RL learns to leave it untouched
(README, "Coding agent": held-out reward 0.080 -> 0.712 with no edit applied). SWE-bench splits the tests in two
by the starting code's grade: fail-to-pass (the issue) and pass-to-pass (everything it must not break).
"""

from __future__ import annotations

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
