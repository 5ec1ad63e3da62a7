"""envs/scoring.py: a score is joined into a new trajectory, a NotedScore's notes with it, the given one untouched."""

import copy

from posttrain.envs.scoring import NotedScore, scored
from posttrain.rewards.rubric import Score
from posttrain.types import Trajectory, Turn


def _traj(**kw):
    return Trajectory(turns=[Turn([1], [2], [-0.1], 0)], metrics={"a": 1.0}, extra={"k": "v"}, **kw)


def test_a_noted_score_joins_its_notes_and_leaves_the_given_record_as_it_was():
    t = _traj()
    before = copy.deepcopy(t)
    got = scored(t, NotedScore(0.5, {"x": 0.5}, False, feedback="off by one", metrics={"b": 2.0}, extra={"n": 1}))
    assert t == before
    assert (got.reward, got.feedback, got.metrics, got.extra) == (0.5, "off by one", {"a": 1.0, "b": 2.0},
                                                                  {"k": "v", "n": 1})


def test_the_env_s_own_feedback_wins_and_a_plain_score_adds_nothing():
    t = _traj(feedback="tool call 2 failed")
    assert scored(t, NotedScore(0.0, {}, False, feedback="wrong answer")).feedback == "tool call 2 failed"
    plain = scored(t, Score(1.0, {}, True))
    assert (plain.feedback, plain.metrics, plain.extra, plain.passed) == (t.feedback, t.metrics, t.extra, True)
