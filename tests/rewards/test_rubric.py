import pytest

from posttrain.rewards import RewardComponent, Rubric


def length(completions, **kw):
    return [float(len(c)) for c in completions]


def test_weights_gate_and_pass():
    def has_x(completions, **kw):
        return [1.0 if "x" in c else 0.0 for c in completions]

    r = Rubric([RewardComponent("has_x", has_x, weight=2.0),
                RewardComponent("length", length, weight=0.5, gate="has_x", pass_threshold=3.0)],
               pass_component="has_x")
    s = r.score(["xab", "abcd"], [{}, {}])
    assert s[0].reward == pytest.approx(2.0 + 0.5 * 3) and s[0].passed
    assert s[1].reward == 0.0 and s[1].components["length"] == 0.0 and not s[1].passed  # gated out


def test_columns_passed_as_kwargs_and_none_is_zero():
    def uses_column(completions, target, **kw):
        return [None if t is None else float(c == t) for c, t in zip(completions, target)]

    r = Rubric.from_funcs([uses_column])
    s = r.score(["a", "b", "c"], [{"target": "a"}, {"target": "a"}, {"target": None}])
    assert [x.reward for x in s] == [1.0, 0.0, 0.0]


def test_raising_function_fails_only_the_bad_sample():
    def picky(completions, **kw):
        out = []
        for c in completions:
            if c == "boom":
                raise ValueError("cannot score boom")
            out.append(1.0)
        return out

    s = Rubric.from_funcs([picky]).score(["ok", "boom", "fine"], [{}, {}, {}])
    assert [x.failed for x in s] == [False, True, False]
    assert "cannot score boom" in s[1].error and s[1].reward == 0.0
    assert s[0].reward == 1.0 and s[2].reward == 1.0


def test_wrong_return_length_or_type_fails_samples():
    s = Rubric.from_funcs([lambda completions, **kw: [1.0]]).score(["a", "b"], [{}, {}])
    assert s[0].failed is False and s[0].reward == 1.0  # per-sample retry returns one value each
    s = Rubric.from_funcs([lambda completions, **kw: ["high"] * len(completions)]).score(["a"], [{}])
    assert s[0].failed and "expected float" in s[0].error


def test_bad_rubric_definitions():
    with pytest.raises(ValueError, match="unique"):
        Rubric([RewardComponent("a", length), RewardComponent("a", length)])
    with pytest.raises(ValueError, match="unknown component"):
        Rubric([RewardComponent("a", length, gate="b")])
    with pytest.raises(ValueError, match="pass_component"):
        Rubric([RewardComponent("a", length)], pass_component="b")
    with pytest.raises(ValueError, match="weights"):
        Rubric.from_funcs([length], [1.0, 2.0])


def test_hanging_reward_function_times_out_and_fails_its_samples():
    import threading
    import time

    release = threading.Event()

    def hangs(completions, **kw):
        release.wait(5)  # stands in for a reward call that never returns
        return [1.0] * len(completions)

    r = Rubric([RewardComponent("ok", length), RewardComponent("hangs", hangs)], timeout_s=0.2)
    t0 = time.perf_counter()
    s = r.score(["a", "bb"], [{}, {}])
    assert time.perf_counter() - t0 < 2.0
    release.set()
    assert all(x.failed for x in s) and "took longer than 0.2s" in s[0].error
