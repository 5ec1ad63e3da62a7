"""Reward mixes: rubric-level gates zero the total and spare the later components the call; the watercolours-style
example (examples/reward_mix.py) combines a gate, a length term, a judge and a learned scorer."""

import importlib.util
from pathlib import Path

import pytest

from posttrain.rewards.rubric import RewardComponent, Rubric


class Counting:
    """A stand-in for an expensive scorer (a judge, a reward model): counts the completions it was asked about."""

    def __init__(self, name, value):
        self.__name__, self.value, self.seen = name, value, []

    def __call__(self, completions, **kw):
        self.seen += list(completions)
        return [self.value] * len(completions)


def test_a_failed_gate_zeroes_the_total_and_the_pass():
    judge = Counting("judge", 0.8)
    r = Rubric([RewardComponent("ok", lambda cs, **k: [float(c.startswith("ok")) for c in cs], weight=0.1),
                RewardComponent("judge", judge, weight=1.0, pass_threshold=0.5)], gates=["ok"])
    good, bad = r.score(["ok fine", "bad"], [{}, {}])
    assert good.reward == pytest.approx(0.9) and good.passed
    assert bad.reward == 0.0 and not bad.passed and bad.components["judge"] == 0.0
    assert judge.seen == ["ok fine"]  # the judge was never asked about the gated-out sample


def test_gate_failure_zeroes_negative_terms_too():
    r = Rubric([RewardComponent("gate", lambda cs, **k: [0.0] * len(cs), weight=0.0),
                RewardComponent("penalty", lambda cs, **k: [-1.0] * len(cs), weight=1.0)], gates=["gate"])
    assert r.score(["x"], [{}])[0].reward == 0.0


def test_all_samples_gated_out_calls_nothing():
    judge = Counting("judge", 1.0)
    r = Rubric([RewardComponent("gate", lambda cs, **k: [0.0] * len(cs), weight=0.0),
                RewardComponent("judge", judge)], gates=["gate"])
    assert [s.reward for s in r.score(["a", "b"], [{}, {}])] == [0.0, 0.0]
    assert judge.seen == []


def test_a_per_component_gate_also_spares_the_call():
    judge = Counting("judge", 1.0)
    r = Rubric([RewardComponent("parse", lambda cs, **k: [float(c == "{}") for c in cs], weight=0.2),
                RewardComponent("judge", judge, gate="parse")])
    a, b = r.score(["{}", "prose"], [{}, {}])
    assert a.reward == pytest.approx(1.2) and b.reward == 0.0 and judge.seen == ["{}"]


def test_failure_inside_the_gated_subset_fails_only_that_sample():
    def flaky(cs, **k):
        if any("boom" in c for c in cs):
            raise RuntimeError("boom")
        return [1.0] * len(cs)

    r = Rubric([RewardComponent("gate", lambda cs, **k: [float(not c.startswith("x")) for c in cs], weight=0.0),
                RewardComponent("flaky", flaky)], gates=["gate"])
    s = r.score(["xx", "fine", "boom"], [{}, {}, {}])
    assert [x.failed for x in s] == [False, False, True] and s[1].reward == 1.0 and "boom" in s[2].error


def test_unknown_gate_is_refused():
    with pytest.raises(ValueError, match="gate 'nope' is not a component"):
        Rubric([RewardComponent("a", lambda cs, **k: [1.0] * len(cs))], gates=["nope"])


def test_the_watercolours_style_example_mixes_gate_length_judge_and_scorer():
    path = Path(__file__).parents[2] / "examples" / "reward_mix.py"
    spec = importlib.util.spec_from_file_location("reward_mix", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    judge, scorer = Counting("judge", 1.0), Counting("reward_model", 2.0)
    rubric = mod.make_rubric(judge, scorer)
    rows = [{"colour": "red"}] * 3
    short = "A red wool scarf with a soft knit."
    long = "A red wool scarf " + "that is very warm " * 8
    linked = "A red scarf, see https://example.com"
    s_short, s_long, s_link = rubric.score([short, long, linked], rows)
    assert s_short.reward == pytest.approx(0.3 + 0.5 + 2.0) and s_short.passed
    assert 0.5 + 2.0 <= s_long.reward < s_short.reward and not s_long.passed  # over 20 words: shaped down, rule fails
    assert s_link.reward == 0.0 and not s_link.passed
    assert linked not in judge.seen and linked not in scorer.seen
