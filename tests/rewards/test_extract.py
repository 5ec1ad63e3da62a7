"""Answer extraction (rewards/extract.py): the one step between a completion and the answer a reward compares.
A table of cases per format, then properties: it never raises and stays fast on any text, however hostile."""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from posttrain.config.formats import ANSWER_FORMATS
from posttrain.rewards.extract import (
    EXTRACTORS,
    MAX_ANSWER_CHARS,
    MAX_SCAN_CHARS,
    completion_text,
    extract_answer,
    has_answer,
)

CASES = [
    # (text, format, expected)
    ("<answer>42</answer>", "auto", "42"),
    ("think... <answer> 3/4 </answer> done", "auto", "3/4"),
    ("<ANSWER>x</Answer>", "answer_tag", "x"),
    ("<answer>a</answer> then <answer>b</answer>", "answer_tag", "b"),
    ("<answer>a</answer> <answer>b", "answer_tag", "a"),  # a complete pair beats a later unclosed tag
    ("<answer>a<answer>b</answer>", "answer_tag", "b"),  # the opening tag nearest the close
    ("reasoning <answer>unclosed tail", "answer_tag", "unclosed tail"),
    ("no tags at all", "answer_tag", None),
    ("<answer></answer>", "answer_tag", None),  # empty is no answer
    ("so \\boxed{\\frac{3}{4}}.", "auto", "\\frac{3}{4}"),
    ("\\boxed{1} and later \\boxed{2}", "boxed", "2"),
    ("\\boxed{a{b}c}", "boxed", "a{b}c"),
    ("\\fbox{7}", "boxed", "7"),
    ("\\boxed{unclosed", "boxed", None),
    ("\\boxed{2} then \\boxed{broken", "boxed", "2"),  # the last box that closes
    ("<answer>tag</answer> \\boxed{box}", "auto", "tag"),  # tags first: the most explicit format
    ("line one\nThe answer is 7.\n\n", "auto", "The answer is 7."),
    ("line one\n  last  \n", "last_line", "last"),
    ("", "auto", None),
    ("   \n\n ", "last_line", None),
    ("I have 3 apples and 1,234.5 pears", "last_number", "1234.5"),
    ("ratio 3 / 4", "last_number", "3/4"),
    ("it is -12", "last_number", "-12"),
    ("value .5", "last_number", ".5"),
    ("no digits", "last_number", None),
    ("  whole text  ", "none", "whole text"),
]


@pytest.mark.parametrize("text,how,expected", CASES)
def test_extract_answer_table(text, how, expected):
    assert extract_answer(text, how) == expected


def test_every_config_answer_format_is_an_extractor():
    assert tuple(EXTRACTORS) == ANSWER_FORMATS  # config/formats.py keeps its own copy (config imports no rewards)


def test_unknown_format_names_the_known_ones():
    with pytest.raises(ValueError, match="unknown answer format 'boxd'; known: auto, answer_tag, boxed"):
        extract_answer("x", "boxd")


@pytest.mark.parametrize("text,how,expected", [
    ("<answer>5</answer>", "answer_tag", True), ("<answer>5", "answer_tag", False), ("<answer> </answer>", "answer_tag", False),
    ("\\boxed{5}", "boxed", True), ("\\boxed{5", "boxed", False), ("\\boxed{}", "boxed", False),
    ("<answer>5</answer>", "auto", True), ("\\boxed{5}", "auto", True), ("just text", "auto", False),
    ("the end 5", "last_number", True), ("no number", "last_number", False),
])
def test_has_answer_table(text, how, expected):
    assert has_answer(text, how) is expected


def test_completion_text_reads_strings_and_chat_messages():
    assert completion_text("plain") == "plain"
    assert completion_text([{"role": "assistant", "content": "chat"}]) == "chat"
    assert completion_text([{"role": "assistant", "content": None}]) == ""
    assert completion_text(None) == ""


def test_only_the_tail_is_read_and_answers_are_clipped():
    assert extract_answer("<answer>early</answer>" + "x" * (MAX_SCAN_CHARS + 10), "answer_tag") is None
    assert len(extract_answer("y" * (MAX_SCAN_CHARS * 3), "none")) == MAX_ANSWER_CHARS


HOSTILE = ["<answer>" * 2500, "<ANSWER>" * 2400 + "</answer>", "</answer>" * 2200, "\\boxed{" * 2800,
           "{" * 20000, "}" * 20000, "\\boxed{" + "{" * 19000, "1," * 10000, "1 " * 10000, " /" * 10000,
           "9" * 200_000, "\n" * 20000, ("x" * 100 + "\n") * 2000, "-" * 20000, ".5" * 10000, "\\fbox{}" * 3000]


@pytest.mark.parametrize("how", list(EXTRACTORS))
def test_hostile_texts_are_fast_in_every_format(how):
    for text in HOSTILE:
        t = time.perf_counter()
        extract_answer(text, how)
        has_answer(text, how)
        # A bound against catastrophic (quadratic or worse) matching, which takes tens of seconds at these sizes;
        # loose, because a loaded 2-core machine slows a linear scan several times over (0.25 s failed under load).
        assert time.perf_counter() - t < 3.0, (how, text[:30])


# Text built from the pieces the extractors look for, so the properties reach their branches.
PIECES = st.sampled_from(["<answer>", "</answer>", "<ANSWER>", "\\boxed{", "\\fbox{", "{", "}", "\n", " ", "1", "2,345",
                          ".5", "/", "-", "%", "x", "é", "\x00", "\ud800"])
TEXTS = st.one_of(st.text(max_size=300), st.lists(PIECES, max_size=400).map("".join))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=TEXTS, how=st.sampled_from(list(EXTRACTORS)))
def test_extraction_never_raises_and_returns_a_clipped_substring(text, how):
    got = extract_answer(text, how)
    assert got is None or (isinstance(got, str) and got and len(got) <= MAX_ANSWER_CHARS and got == got.strip())
    if got is not None and how != "last_number":  # last_number drops commas and spaces
        assert got in text
    assert isinstance(has_answer(text, how), bool)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(piece=PIECES, n=st.integers(1000, 20000), how=st.sampled_from(list(EXTRACTORS)))
def test_long_repetitions_of_any_piece_stay_fast(piece, n, how):
    text = piece * (n // len(piece))
    t = time.perf_counter()
    extract_answer(text, how)
    has_answer(text, how)
    assert time.perf_counter() - t < 0.25
