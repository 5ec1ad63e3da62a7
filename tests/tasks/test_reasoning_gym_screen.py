"""What reasoning-gym's scorers may see (tasks/reasoning_gym_screen.py): NaN and infinity in every spelling a scorer
reads as a number never reach it (complex_arithmetic scores `min(1.0, exp(-nan))`, which is 1.0), and answers a
scorer would expand (rubiks_cube's repeat counts, rush_hour's step counts) stay small."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("reasoning_gym")

from posttrain.tasks import reasoning_gym as rg
from posttrain.tasks._reasoning_gym_worker import dataset_for, loads_entry
from posttrain.tasks.load import load_task


@pytest.fixture(autouse=True, scope="module")
def _scorers_end_with_the_module():
    """The process's scorer workers end with this module's tests, not at interpreter exit (after the session's
    check for processes left behind)."""
    yield
    from posttrain.tasks.reasoning_gym_screen import close_scorer_pool

    close_scorer_pool()

_WORDS = ["nan", "inf", "infinity", "snan"]
_FULLWIDTH = {c: chr(ord(c) + 0xFEE0) for c in "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ+-."}


def _any_case(word: str):
    return st.lists(st.booleans(), min_size=len(word), max_size=len(word)).map(
        lambda ups: "".join(c.upper() if up else c for c, up in zip(word, ups)))


_word = st.sampled_from(_WORDS).flatmap(_any_case)
_finite = st.sampled_from(["1", "3.5", "-2", "0", "12e3", "7"])
_sign = st.sampled_from(["", "+", "-"])
_unit = st.sampled_from(["j", "i", "J", "I"])


@st.composite
def non_finite(draw, dropped: str = " ") -> str:
    """A NaN or an infinity as float(), complex(), Decimal(), json or complex_arithmetic's parser may read it:
    any case, signed, as a real or an imaginary part, overflowing, in brackets, in fullwidth letters, and with
    what the scorer drops before it reads a number between its characters (complex_arithmetic: spaces)."""
    form = draw(st.sampled_from(["word", "imaginary", "complex_imag", "complex_real", "overflow", "digits"]))
    if form == "word":
        text = draw(_sign) + draw(_word)
    elif form == "imaginary":
        text = draw(_sign) + draw(_word) + draw(_unit)
    elif form == "complex_imag":  # 1+nanj, 3-infi
        text = draw(_finite) + draw(st.sampled_from(["+", "-"])) + draw(_word) + draw(_unit)
    elif form == "complex_real":  # nan+1j
        text = draw(_sign) + draw(_word) + draw(st.sampled_from(["+", "-"])) + draw(_finite) + draw(_unit)
    elif form == "overflow":  # 1e999, 2.5E+400j
        exp = draw(st.integers(309, 99999))
        text = f"{draw(_sign)}{draw(_finite).lstrip('-')}e{draw(st.sampled_from(['', '+']))}{exp}"
        text += draw(st.sampled_from(["", "j", "i"]))
    else:  # a number with more digits than a float holds: float() makes it inf
        text = draw(_sign) + "9" * draw(st.integers(310, 400)) + draw(st.sampled_from(["", ".5", "j"]))
    if draw(st.booleans()):
        text = f"({text})"
    if dropped and draw(st.booleans()):
        text = draw(st.sampled_from(dropped)).join(text)
    if draw(st.booleans()):
        text = "".join(_FULLWIDTH.get(c, c) for c in text)
    return text


_TASKS: dict = {}


def _task(name):
    if name not in _TASKS:
        _TASKS[name] = load_task(f"reasoning_gym:{name}", {"train_size": 4, "eval_size": 1})
    return _TASKS[name]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=non_finite())
def test_complex_arithmetic_scores_every_nan_and_infinity_spelling_zero(text):
    """reasoning-gym 0.1.25 scores `nanj`, `nani` and `1+nanj` 1.0 on every question."""
    task = _task("complex_arithmetic")
    score = task.rubric.components[0].func
    rows = task.train_rows[:2]
    values = score([f"<answer>{text}</answer>"] * 2, [r["rg_entry"] for r in rows], [r["rg_spec"] for r in rows],
                   answer=[r["answer"] for r in rows])
    assert values == [0.0, 0.0], text


@pytest.mark.parametrize("text", ["nanj", "nani", "1+nanj", "NaN", "-inf", "infinity", "1e999", "nan+1j"])
def test_the_spellings_the_tester_found_score_zero_and_do_not_pass(text):
    task = _task("complex_arithmetic")
    row = task.train_rows[0]
    ds, entry = dataset_for(row["rg_spec"]), loads_entry(row["rg_entry"])
    if text in ("nanj", "nani", "1+nanj"):
        assert ds.score_answer(text, entry) == 1.0  # the dataset's own bug, still there in 0.1.25
    from posttrain.envs.smoke_checks import score_completion

    s = score_completion(task, row, f"<answer>{text}</answer>")
    assert s.components["rg_score"] == 0.0 and not s.passed


# What each scorer drops before it reads a number (its source in reasoning-gym 0.1.25).
_DROPS = {"basic_arithmetic": "", "number_sorting": "", "decimal_arithmetic": "", "codeio": "", "pool_matrix": "",
          "polynomial_equations": "", "complex_arithmetic": " ", "number_format": ",", "chain_sum": ",",
          "coin_flip": ",", "advanced_geometry": "°()"}


@settings(max_examples=200, deadline=None)
@given(data=st.data(), name=st.sampled_from(sorted(_DROPS)))
def test_no_scorer_sees_a_non_finite_number(data, name):
    """Every scorer that reads numbers (float, complex, Decimal, json's NaN and Infinity, numpy) gets none that is
    not finite, unless the dataset's own reference holds one."""
    text = data.draw(non_finite(_DROPS[name]))
    assert not rg.screen(name, text, reference="42"), text
    assert not rg.screen(name, f"[1, {text}, 3]", reference="[1, 2, 3]"), text


def test_a_reference_may_hold_the_words_and_words_that_merely_contain_them_pass():
    assert rg.screen("family_relationships", "Nan", reference="Nan")
    for word in ("banana", "info", "infer", "nancy", "infix", "Fernando", "infinite", "financial"):
        assert rg.screen("family_relationships", word, reference="mother"), word


@pytest.mark.parametrize("text", ["1e٩٩٩٩٩٩٩٩٩", "1e9_99", "1E0_0999999", "1e९९९"])
def test_an_exponent_in_any_digits_or_with_underscores_is_screened(text):
    """Fraction and float read Unicode digits and underscores: 10**999999999 in C, past any timeout."""
    assert not rg.screen("coin_flip", text)


def test_sympys_infinity_is_not_a_symbolic_answer():
    assert not rg.screen("simple_integration", "oo") and not rg.screen("polynomial_multiplication", "x*oo")
    assert rg.screen("simple_integration", "x**2/2 + C")


@pytest.mark.parametrize("name, bad, good", [
    # expand_moves writes `R9999999` out as ten million moves, each a numpy rotation: minutes of CPU
    ("rubiks_cube", ["R9999999", "U2 R999 F' L1000", "R" + "٩" * 7, " ".join(["R9"] * 200)],
     ["R U R' U'", "R2 U2 F2", "F' B2 L3", " ".join(["R2"] * 100), "no moves at all"]),
    # perform_moves loops once per step: `A+99999999999` never ends
    ("rush_hour", ["A+99999999999", "B-1000000", "A+" + "٩" * 8, " ".join(["A+9"] * 200)],
     ["A+1 B-2 C+3", "F+1 K+1 M-1 C+3 H+2", "nothing"]),
])
def test_answers_a_scorer_would_expand_are_bounded(name, bad, good):
    for text in bad:
        assert not rg.screen(name, text), text[:40]
    for text in good:
        assert rg.screen(name, text), text
