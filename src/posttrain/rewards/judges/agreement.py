"""Agreement between two raters of binary verdicts (a judge vs a programmatic verifier): pure functions.

`cohen_kappa` uses scikit-learn's `cohen_kappa_score` when it is installed (the reference implementation) and a
small pure function otherwise; the tests check that both give the same numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Confusion:
    """Counts of (verifier, judge) verdict pairs. `tp`: both pass; `fp`: the judge passes what the verifier fails
    (the costly error for training: it rewards a wrong answer); `fn`: the judge fails a right answer."""

    tp: int
    fp: int
    fn: int
    tn: int

    @property
    def n(self) -> int:
        return self.tp + self.fp + self.fn + self.tn

    def rows(self) -> list[tuple[str, int, int]]:
        """(verifier verdict, judge pass, judge fail) rows, for a printed table."""
        return [("verifier pass", self.tp, self.fn), ("verifier fail", self.fp, self.tn)]


def _check(truth: Sequence[bool], pred: Sequence[bool]) -> None:
    if len(truth) != len(pred):
        raise ValueError(f"verdict lists differ in length: {len(truth)} vs {len(pred)}")


def confusion(truth: Sequence[bool], pred: Sequence[bool]) -> Confusion:
    """`truth`: the verifier's verdicts; `pred`: the judge's."""
    _check(truth, pred)
    tp = sum(1 for t, p in zip(truth, pred) if t and p)
    fp = sum(1 for t, p in zip(truth, pred) if not t and p)
    fn = sum(1 for t, p in zip(truth, pred) if t and not p)
    return Confusion(tp=tp, fp=fp, fn=fn, tn=len(truth) - tp - fp - fn)


def agreement(truth: Sequence[bool], pred: Sequence[bool]) -> float:
    """Share of samples where both verdicts are the same (nan for no samples)."""
    _check(truth, pred)
    if not truth:
        return float("nan")
    return sum(bool(t) == bool(p) for t, p in zip(truth, pred)) / len(truth)


def kappa_from_confusion(c: Confusion) -> float:
    """Cohen's kappa: (observed agreement - chance agreement) / (1 - chance agreement), chance from the two
    raters' marginals. 0 when both raters are constant and agree (no information either way, as sklearn's 0/0
    guard would give nan; we report 0 so a table stays numeric); nan for no samples."""
    n = c.n
    if n == 0:
        return float("nan")
    po = (c.tp + c.tn) / n
    p_yes = ((c.tp + c.fn) / n) * ((c.tp + c.fp) / n)
    p_no = ((c.fp + c.tn) / n) * ((c.fn + c.tn) / n)
    pe = p_yes + p_no
    if pe >= 1.0:
        return 0.0
    return (po - pe) / (1.0 - pe)


def cohen_kappa_pure(truth: Sequence[bool], pred: Sequence[bool]) -> float:
    return kappa_from_confusion(confusion(truth, pred))


def cohen_kappa(truth: Sequence[bool], pred: Sequence[bool]) -> float:
    _check(truth, pred)
    c = confusion(truth, pred)
    # Both raters constant: sklearn warns and returns nan; the pure function's 0 is the documented answer.
    if c.n == 0 or len({bool(t) for t in truth} | {bool(p) for p in pred}) < 2:
        return kappa_from_confusion(c)
    try:
        from sklearn.metrics import cohen_kappa_score
    except ImportError:
        return kappa_from_confusion(c)
    return float(cohen_kappa_score([bool(t) for t in truth], [bool(p) for p in pred]))


def auc(scores_pos: Sequence[float], scores_neg: Sequence[float]) -> float:
    """Area under the ROC curve of a score separating positives from negatives (Mann-Whitney: the chance that a
    random positive scores above a random negative, ties half): threshold-free, 0.5 is chance, below 0.5 the
    score points the wrong way. nan when either side is empty."""
    if not scores_pos or not scores_neg:
        return float("nan")
    wins = sum((p > n) + 0.5 * (p == n) for p in scores_pos for n in scores_neg)
    return wins / (len(scores_pos) * len(scores_neg))
