"""grade_pytest's per_test is verdicts only (issue #42): a run cut short reports None (unknown), never a map of
tests that 'failed' without having run to a verdict. A repair task's baseline read from such a map paid untouched
code for 'fixing' them (tasks/baselines.py)."""

import os

import pytest

from posttrain.sandbox import grade_pytest

TESTS = {"test_m.py": "from m import f\n\n\ndef test_fast():\n    assert f() == 1\n\n\n"
                      "def test_slow():\n    import time\n    time.sleep(60)\n    assert f() == 1\n"}
SOLUTION = {"m.py": "def f():\n    return 1\n"}


@pytest.mark.parametrize("mode", ["out-of-process", "in-process"])
def test_a_grade_that_timed_out_has_no_per_test_verdicts(cfg, mode):
    if mode == "out-of-process" and os.geteuid() != 0:
        pytest.skip("out-of-process grading needs root")
    g = grade_pytest(SOLUTION, TESTS, cfg.model_copy(update={"timeout_s": 3.0, "case_timeout_s": None}), mode=mode)
    assert g.timed_out and g.per_test is None  # test_fast passed and test_slow never finished: unknown, not failed
    assert g.score == 0.0 and "timed out" in g.error  # as a solution's grade it is still a fail


@pytest.mark.parametrize("mode", ["out-of-process", "in-process"])
def test_a_complete_run_keeps_its_per_test_verdicts(cfg, mode):
    if mode == "out-of-process" and os.geteuid() != 0:
        pytest.skip("out-of-process grading needs root")
    fast = {"test_m.py": TESTS["test_m.py"].split("\n\n\ndef test_slow")[0] + "\n"}
    g = grade_pytest({"m.py": "def f():\n    return 2\n"}, fast, cfg, mode=mode)
    assert not g.timed_out and g.per_test == {"test_m.py::test_fast": False}  # a real failure stays a verdict


def test_a_link_that_ran_out_of_time_has_no_per_test_verdicts(cfg):
    """Out of process, one request to the solution that misses its deadline (a starved machine, or a hang) ends
    the link, and every later test fails for lack of an answer: a complete report, but not verdicts on the code.
    The items still count for the score; the per-test map is unknown."""
    if os.geteuid() != 0:
        pytest.skip("out-of-process grading needs root")
    tests = {"test_m.py": "from m import f, g\n\n\ndef test_slow():\n    assert g() == 1\n\n\n"
                          "def test_after():\n    assert f() == 1\n"}
    sol = {"m.py": "import time\n\ndef f():\n    return 1\n\ndef g():\n    time.sleep(30)\n    return 1\n"}
    g = grade_pytest(sol, tests, cfg.model_copy(update={"timeout_s": 20.0, "case_timeout_s": 1.0}),
                     mode="out-of-process")
    assert not g.timed_out and g.score == 0.0  # the whole run ended in time; both tests failed
    assert g.per_test is None and "stopped answering" in g.error, g.error
