"""rewards/repair_grades.py: the repair reward pays for the tests the issue breaks, never for the untouched code."""

import pytest

from posttrain.rewards.repair_grades import check_repair_reward, issue_score


def test_issue_score_pays_for_the_broken_tests_only():
    start = {"a": True, "b": True, "c": False, "d": False}
    assert issue_score(start, dict(start)) == 0.0  # untouched: half the tests pass, none of the issue's
    assert issue_score(start, {"a": True, "b": True, "c": True, "d": True}) == 1.0
    assert issue_score(start, {"a": True, "b": True, "c": True, "d": False}) == 0.5
    assert issue_score(start, {"a": False, "b": True, "c": True, "d": True}) == 0.5  # a fix that breaks other code
    assert issue_score(start, {t: False for t in start}) == 0.0  # a module that no longer imports
    assert issue_score(start, {}) == 0.0  # nothing reported
    assert issue_score({"a": False}, {"a": True}) == 1.0  # no pass-to-pass tests
    # never a fallback a wrong answer could earn: the start fails nothing, or a grade has no per-test results
    assert issue_score({"a": True}, {"a": True}) == 0.0
    assert issue_score(None, {"a": True}) == 0.0 and issue_score(start, None) == 0.0


def test_repair_reward_names_are_checked():
    assert check_repair_reward("issue_tests") == "issue_tests"
    with pytest.raises(ValueError, match="reward must be one of"):
        check_repair_reward("all_tests")


def test_an_unknown_baseline_fails_the_sample_while_paid_and_is_left_out_while_logged():
    from posttrain.rewards.rubric import PartialRewardFailure
    from posttrain.rewards.repair_grades import Baseline, issue_rewards

    start = {"a": True, "b": False}
    pairs = [(Baseline(start), {"a": True, "b": True}), (Baseline(None, "timed out"), dict(start)), None]
    with pytest.raises(PartialRewardFailure) as e:
        issue_rewards(pairs, paid=True)
    assert e.value.values == [1.0, None, 0.0] and list(e.value.errors) == [1] and "timed out" in e.value.errors[1]
    assert issue_rewards(pairs, paid=False) == [1.0, None, 0.0]  # logged only: "does not apply", no failure
    assert issue_rewards(pairs[:1] + pairs[2:], paid=True) == [1.0, 0.0]
