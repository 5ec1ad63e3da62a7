"""Agreement math (pure functions) and the pairwise / ranking helpers."""

import math

import pytest

from posttrain.rewards.judges.agreement import (agreement, cohen_kappa, cohen_kappa_pure, confusion,
                                                kappa_from_confusion)
from posttrain.rewards.judges.pairwise import pair_verdict
from posttrain.rewards.judges.ranking import parse_ranking, rank_scores
from posttrain.rewards.judges.errors import JudgeBadOutput


def test_confusion_and_agreement():
    truth = [True, True, False, False, True]
    pred = [True, False, True, False, True]
    c = confusion(truth, pred)
    assert (c.tp, c.fp, c.fn, c.tn) == (2, 1, 1, 1)
    assert agreement(truth, pred) == pytest.approx(3 / 5)


def test_kappa_known_value():
    # Po = 0.7, Pe = 0.5*0.6 + 0.5*0.4 = 0.5 -> kappa 0.4
    c = confusion([True] * 5 + [False] * 5, [True] * 4 + [False] + [True] * 2 + [False] * 3)
    assert kappa_from_confusion(c) == pytest.approx(0.4)


def test_kappa_edges():
    assert cohen_kappa_pure([True, False], [True, False]) == 1.0
    assert cohen_kappa_pure([True, False], [False, True]) == -1.0
    assert cohen_kappa_pure([True, True], [True, True]) == 0.0  # both constant: no information
    assert math.isnan(cohen_kappa_pure([], []))
    with pytest.raises(ValueError, match="length"):
        agreement([True], [])


@pytest.mark.parametrize("seed", range(5))
def test_pure_kappa_matches_sklearn(seed):
    pytest.importorskip("sklearn")
    import random

    from sklearn.metrics import cohen_kappa_score

    rng = random.Random(seed)
    truth = [rng.random() < 0.6 for _ in range(50)]
    pred = [t if rng.random() < 0.7 else not t for t in truth]
    assert cohen_kappa_pure(truth, pred) == pytest.approx(cohen_kappa_score(truth, pred))
    assert cohen_kappa(truth, pred) == pytest.approx(cohen_kappa_score(truth, pred))


def test_pair_verdict_cancels_position_preference():
    v = pair_verdict(0.9, 0.9)  # "first is better" in both orders: pure position bias
    assert v.flipped and v.p_a == pytest.approx(0.5)
    v = pair_verdict(0.8, 0.3)  # a better in both orders
    assert not v.flipped and v.p_a == pytest.approx(0.75)
    assert not pair_verdict(0.5, 0.5).flipped


def test_parse_ranking():
    assert parse_ranking("3 > 1 > 2", 3) == [2, 0, 1]
    assert parse_ranking("Ranking: [2], [1]", 2) == [1, 0]
    for bad in ("1 > 1 > 2", "1 > 2", "no idea"):
        with pytest.raises(JudgeBadOutput):
            parse_ranking(bad, 3)
    assert rank_scores([2, 0, 1]) == [0.5, 0.0, 1.0]


def test_auc():
    from posttrain.rewards.judges.agreement import auc

    assert auc([0.9, 0.8], [0.1, 0.2]) == 1.0
    assert auc([0.1], [0.9]) == 0.0
    assert auc([0.5], [0.5]) == 0.5
    assert math.isnan(auc([], [0.1]))
