import pytest

from gradebook.roster import Roster


def _roster():
    r = Roster()
    for name, hw, exam in [("Cid", [100, 20], 90), ("Ana", [100, 50], 90), ("Bo", [70, 60], 60)]:
        for s in hw:
            r.record(name, "homework", s)
        r.record(name, "exams", exam)
    return r


def test_final_weights_exams_most():
    r = _roster()
    assert r.final("Cid") == 93.0
    assert r.final("Bo") == 63.0


def test_ranking_orders_ties_by_name():
    r = _roster()
    assert r.ranking() == [("Ana", 93.0, "A"), ("Cid", 93.0, "A"), ("Bo", 63.0, "D")]


def test_record_rejects():
    r = Roster()
    with pytest.raises(ValueError):
        r.record("Ana", "quiz", 50)
    with pytest.raises(ValueError):
        r.record("Ana", "exams", 101)
