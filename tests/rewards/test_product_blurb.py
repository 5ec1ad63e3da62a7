"""The built-in preference data: every pair obeys the hidden rule the way it claims to."""

import collections
import re

from posttrain.tasks import product_blurb as pb


def test_chosen_follows_the_rule_and_rejected_breaks_it_the_stated_way():
    train, held = pb.preference_pairs(n_train=400, n_eval=100, seed=3)
    for p in train + held:
        c, r, colour = p["chosen"], p["rejected"], p["colour"]
        assert pb.rule_ok(c, colour) and not pb.rule_ok(r, colour)
        long = len(pb.words(r)) > pb.MAX_WORDS
        assert long == (p["kind"] in ("too_long", "no_colour_long"))
        assert pb.mentions(r, colour) == (p["kind"] == "too_long")
    assert set(collections.Counter(p["kind"] for p in train).values()) == {100}


def test_held_out_items_are_unseen_and_splits_are_deterministic():
    train, held = pb.preference_pairs(n_train=300, n_eval=50)
    assert not {p["noun"] for p in train} & {p["noun"] for p in held}
    assert pb.preference_pairs(n_train=10, n_eval=50)[1] == held  # held-out does not depend on n_train


def test_no_template_text_names_a_colour_by_accident():
    text = " ".join(pb.FILLERS + pb.CLOSERS + [f for _, fs in pb.ITEMS for f in fs] + [n for n, _ in pb.ITEMS]
                    + pb.MATERIALS + pb.TEMPLATES + [pb.PROMPT])
    for colour in pb.COLOURS:
        assert not re.search(rf"\b{colour}\b", text, re.IGNORECASE), colour


def test_hidden_rule_reward():
    assert pb.hidden_rule(["A teal mug.", "A mug.", "teal " * 25], colour=["teal"] * 3) == [1.0, 0.0, 0.0]


def test_a_blurb_ends_at_its_first_line_by_default():
    assert pb.make_task(reward="rule", n_train=4, n_eval=0).stop == ["\n"]
    assert pb.make_task(reward="rule", n_train=4, n_eval=0, one_line=False).stop == ["\n\n"]
