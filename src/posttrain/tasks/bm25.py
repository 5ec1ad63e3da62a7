"""A small BM25 index (Okapi BM25, Robertson & Zaragoza 2009, "The Probabilistic Relevance Framework").

    score(q, d) = sum over distinct terms t of q:
                      idf(t) * tf(t,d) * (k1 + 1) / (tf(t,d) + k1 * (1 - b + b * |d| / avgdl))
    idf(t)      = ln((N - n(t) + 0.5) / (n(t) + 0.5) + 1)      (Lucene's form: never negative)

Tokens are lowercase runs of letters and digits. Everything here is a pure function over a frozen index, so the
same corpus always gives the same ranking; ties are broken by document order.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass

K1, B = 1.5, 0.75
_WORD = re.compile(r"[a-z0-9]+")


def tokenize(text: str) -> list[str]:
    return _WORD.findall(text.lower())


@dataclass(frozen=True)
class Index:
    ids: tuple[str, ...]
    texts: tuple[str, ...]
    tf: tuple[dict[str, int], ...]  # term counts per document
    lengths: tuple[int, ...]
    df: dict[str, int]  # number of documents holding each term
    avgdl: float


def build_index(docs: list[tuple[str, str]]) -> Index:
    """Index `(id, text)` pairs."""
    if not docs:
        raise ValueError("cannot index an empty corpus")
    tf = tuple(dict(Counter(tokenize(text))) for _, text in docs)
    df: Counter[str] = Counter()
    for counts in tf:
        df.update(counts.keys())
    lengths = tuple(sum(c.values()) for c in tf)
    return Index(
        ids=tuple(i for i, _ in docs),
        texts=tuple(t for _, t in docs),
        tf=tf,
        lengths=lengths,
        df=dict(df),
        avgdl=sum(lengths) / len(lengths),
    )


def idf(index: Index, term: str) -> float:
    n, N = index.df.get(term, 0), len(index.ids)
    return math.log((N - n + 0.5) / (n + 0.5) + 1.0)


def score(index: Index, query: str, doc: int, k1: float = K1, b: float = B) -> float:
    """BM25 score of document number `doc` for `query` (each distinct query term counts once)."""
    counts, dl = index.tf[doc], index.lengths[doc]
    total = 0.0
    for term in dict.fromkeys(tokenize(query)):
        tf = counts.get(term, 0)
        if tf:
            total += idf(index, term) * tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / index.avgdl))
    return total


def top_k(index: Index, query: str, k: int = 2) -> list[tuple[int, float]]:
    """The `k` best `(doc number, score)` pairs with a positive score, best first."""
    scored = [(i, score(index, query, i)) for i in range(len(index.ids))]
    scored = [(i, s) for i, s in scored if s > 0]
    scored.sort(key=lambda p: (-p[1], p[0]))
    return scored[:k]
