"""Rewards by name (rewards/named.py) and from the config (rewards/from_config.py): each reward's table of cases,
the math checker's time bound on hostile answers, the pass rule, and the message a user sees for each mistake."""

from __future__ import annotations

import pickle
import threading
import time

import pytest

from posttrain.rewards.answer_scores import choice_letter, parse_number
from posttrain.rewards.from_config import RewardConfigError, add_rewards, check_columns, rubric_from_specs
from posttrain.rewards.named import NAMED_REWARDS, named_reward
from posttrain.rewards.rubric import PartialRewardFailure, RewardComponent, Rubric


def score(fn: str, completions: list, **columns_and_options):
    columns = {k: v for k, v in columns_and_options.items() if isinstance(v, list)}
    options = {k: v for k, v in columns_and_options.items() if not isinstance(v, list)}
    return named_reward(fn, **options)(completions, **columns)


# ------------------------------------------------------------------------------------------------------------ math

MATH_CASES = [
    # (gold, completion, expected)
    ("3/4", "\\boxed{\\frac{3}{4}}", 1.0),
    ("0.75", "so the result is \\boxed{\\frac34}", 1.0),
    ("3/4", "The answer is 0.75", 1.0),
    ("\\frac{1}{2}", "<answer>0.5</answer>", 1.0),
    ("0.5", "<answer>50%</answer>", 1.0),
    ("50", "\\boxed{50\\%}", 1.0),
    ("12", "\\boxed{12 \\text{ cm}}", 1.0),
    ("12", "It measures 12 cm", 1.0),
    ("1234", "\\boxed{1,234}", 1.0),
    ("\\sqrt{2}", "\\boxed{2^{1/2}}", 1.0),
    ("-3", "\\boxed{-3}", 1.0),
    ("10", "\\boxed{10.0}", 1.0),
    ("x^2+1", "\\boxed{1 + x^2}", 1.0),
    ("(1,2)", "\\boxed{(1, 2)}", 1.0),
    ("13", "7 + 6 = 13", 1.0),
    ("7", "\\boxed{8}", 0.0),
    ("3/4", "\\boxed{4/3}", 0.0),
    ("7", "garbage text", 0.0),
    ("7", "", 0.0),
    ("7", "\\boxed{", 0.0),
    ("\\pi", "\\boxed{3.14159}", 0.0),
]


@pytest.mark.parametrize("gold,completion,expected", MATH_CASES)
def test_math_table(gold, completion, expected):
    assert score("math", [completion], answer=[gold]) == [expected]


def test_math_takes_chat_completions_a_gold_column_and_numbers():
    fn = named_reward("math", answer_column="solution")
    chat = [[{"role": "assistant", "content": "\\boxed{4}"}], [{"role": "assistant", "content": "\\boxed{5}"}]]
    assert fn(chat, solution=[4, "4"], prompts=["p", "p"]) == [1.0, 0.0]
    assert fn.__name__ == "math" and "math-verify" in fn.__doc__


HOSTILE = ["\\boxed{9^{9^{9^{9}}}}", "\\boxed{2^{2^{2^{2^{2^{2}}}}}}", "\\boxed{10^{10^{10}}}"]


def test_a_hostile_answer_is_bounded_scores_zero_and_is_counted():
    fn = named_reward("math", timeout_s=1.0)
    fn(["\\boxed{1}"], answer=["1"])  # the checker is started (once per process), not timed
    fn.drain_metrics()
    for text in HOSTILE:
        t = time.monotonic()
        assert fn([text], answer=["3"]) == [0.0]
        assert time.monotonic() - t < 3 * 1.0, text
    m = fn.drain_metrics()
    assert m["reward/math/timeouts"] == len(HOSTILE) and m["reward/math/checked"] == len(HOSTILE)


def test_a_batch_of_hostile_answers_is_bounded_and_the_right_ones_still_score():
    fn = named_reward("math", timeout_s=1.0)
    fn(["\\boxed{1}"], answer=["1"])
    batch = [*HOSTILE, "\\boxed{3}", HOSTILE[0], "\\boxed{\\frac{6}{2}}"]
    t = time.monotonic()
    out = fn(batch, answer=["3"] * len(batch))
    took = time.monotonic() - t
    assert out == [0.0, 0.0, 0.0, 1.0, 0.0, 1.0]
    assert took < 3 * 4 * 1.0, took  # four hostile answers, each at most its limit (x3 for a loaded machine)
    assert fn.drain_metrics()["reward/math/timeouts"] == 4


def test_the_whole_call_is_bounded_by_batch_timeout_s():
    fn = named_reward("math", timeout_s=1.5, batch_timeout_s=2.0)
    fn(["\\boxed{1}"], answer=["1"])
    t = time.monotonic()
    out = fn(HOSTILE * 4, answer=["3"] * 12)  # 12 x 1.5 s one after another would be 18 s
    assert time.monotonic() - t < 3 * 2.0
    assert out == [0.0] * 12 and fn.drain_metrics()["reward/math/timeouts"] == 12


def test_math_works_from_a_thread_where_math_verifys_own_timeout_cannot():
    # The rubric calls reward functions in a thread (its reward timeout); math-verify's signal.alarm raises there.
    out: list = []
    t = threading.Thread(target=lambda: out.append(score("math", ["\\boxed{\\frac{1}{2}}"], answer=["0.5"])))
    t.start()
    t.join(30)
    assert out == [[1.0]]


def test_math_skips_overlong_answers_and_fails_a_row_without_a_gold():
    fn = named_reward("math", max_answer_chars=10)
    assert fn(["\\boxed{" + "1" * 50 + "}"], answer=["1"]) == [0.0]
    assert fn.drain_metrics()["reward/math/too_long"] == 1
    with pytest.raises(PartialRewardFailure) as e:
        fn(["\\boxed{1}", "\\boxed{2}"], answer=["", "2"])
    assert e.value.values == [None, 1.0] and "the row's 'answer' is empty" in e.value.errors[0]


# ---------------------------------------------------------------------------------------------- the other rewards


@pytest.mark.parametrize("completion,gold,options,expected", [
    ("<answer> Paris </answer>", "Paris", {}, 1.0),
    ("<answer>paris</answer>", "Paris", {}, 0.0),
    ("<answer>paris</answer>", "Paris", {"case_insensitive": True}, 1.0),
    ("<answer>New   York</answer>", "New York", {}, 1.0),
    ("<answer>New   York</answer>", "New York", {"normalize_whitespace": False}, 0.0),
    ("line\nParis", "Paris", {}, 1.0),  # auto: the last line
    ("Paris is it", "Paris", {"answer_format": "none"}, 0.0),
    ("", "Paris", {}, 0.0),
])
def test_exact(completion, gold, options, expected):
    assert score("exact", [completion], answer=[gold], **options) == [expected]


@pytest.mark.parametrize("completion,gold,options,expected", [
    ("\\boxed{1,234}", "1234", {}, 1.0),
    ("\\boxed{3/4}", "0.75", {}, 1.0),
    ("\\boxed{\\frac{3}{4}}", "0.75", {}, 1.0),
    ("\\boxed{50%}", "0.5", {}, 1.0),
    ("\\boxed{50\\%}", "50", {}, 1.0),  # a percent reads as x/100 and as x
    ("\\boxed{0.5}", "50%", {}, 1.0),
    ("The answer is $12.", "12", {}, 1.0),
    ("x = 12 cm", "12", {}, 1.0),
    ("\\boxed{-.5}", "-0.5", {}, 1.0),
    ("\\boxed{1e3}", "1000", {}, 1.0),
    ("\\boxed{3.1416}", "3.14159", {}, 0.0),
    ("\\boxed{3.1416}", "3.14159", {"abs_tol": 1e-3}, 1.0),
    ("\\boxed{101}", "100", {"rel_tol": 0.02}, 1.0),
    ("\\boxed{1e999}", "1e999", {}, None),  # the gold is no finite number: that row fails (below)
    ("\\boxed{inf}", "5", {}, 0.0),
    ("\\boxed{nan}", "5", {}, 0.0),
    ("\\boxed{1/0}", "5", {}, 0.0),
    ("\\boxed{10**10**10}", "10", {}, 0.0),  # an expression, not a number
    ("3 + 4 = 7", "7", {}, 1.0),  # the right side of the last "="
    ("12 apples after 3 tries", "12", {}, 0.0),  # several numbers among words: none is the answer
    ("no number", "5", {}, 0.0),
    ("\\boxed{5}", 5, {}, 1.0),
    ("\\boxed{5.0}", 5.0, {}, 1.0),
])
def test_numeric(completion, gold, options, expected):
    if expected is None:
        with pytest.raises(PartialRewardFailure, match="is not a number"):
            score("numeric", [completion], answer=[gold], **options)
        return
    assert score("numeric", [completion], answer=[gold], **options) == [expected]


def test_parse_number_never_gives_a_non_finite_value():
    assert parse_number("1e999") == [] and parse_number("9" * 400) == [] and parse_number("abc") == []
    assert parse_number("1,234,567.5") == [1234567.5] and parse_number("-3 / 4") == [-0.75]


@pytest.mark.parametrize("completion,gold,options,expected", [
    ("the capital is Paris, of course", "Paris", {"answer_format": "none"}, 1.0),
    ("the capital is paris", "Paris", {"answer_format": "none", "case_insensitive": True}, 1.0),
    ("Paris\nno wait, Rome", "Paris", {}, 0.0),  # auto reads the last line only
])
def test_contains(completion, gold, options, expected):
    assert score("contains", [completion], answer=[gold], **options) == [expected]


def test_regex_is_compiled_once_matches_the_answer_and_times_out_to_zero():
    fn = named_reward("regex", pattern=r"^\d{4}-\d{2}-\d{2}$", fullmatch=True)
    assert fn(["<answer>2024-01-31</answer>", "<answer>31/01/2024</answer>"]) == [1.0, 0.0]
    assert fn.state() is fn.state()  # compiled when built, kept
    slow = named_reward("regex", pattern=r"(a|aa)+$", answer_format="none", timeout_s=0.2)
    t = time.monotonic()
    assert slow(["a" * 1500 + "b"]) == [0.0]
    assert time.monotonic() - t < 5.0  # the regex module checks its clock now and then, not at every step
    assert slow.drain_metrics() == {"reward/regex/timeouts": 1.0}
    assert named_reward("regex", pattern="yes", ignore_case=True)(["<answer>YES</answer>"]) == [1.0]


@pytest.mark.parametrize("text,expected", [
    ("The answer is (C)", "C"), ("Answer: B", "B"), ("the answer is D.", "D"), ("C)", "C"), ("C. because", "C"),
    ("**C**", "C"), ("I pick **(B)** here", "B"), ("\\boxed{C}", "C"), ("(D) seems right", "D"), ("E", "E"),
    ("  (J).", "J"), ("Plan A is bad", None), ("A good question", None), ("K)", None), ("", None),
    ("A) is wrong, the answer is (B)", "B"),
])
def test_choice_letter(text, expected):
    assert choice_letter(text) == expected


def test_choice_reads_letters_and_zero_based_indices():
    fn = named_reward("choice")
    assert fn(["The answer is (C)", "\\boxed{B}", "answer: A", "**D**"], answer=["C", "(b)", 0, 3]) == [1.0] * 4
    assert fn(["The answer is (C)"], answer=["D"]) == [0.0]
    with pytest.raises(PartialRewardFailure, match="not one of the letters ABCDEFGHIJ or an index 0-9"):
        fn(["C"], answer=["Z"])


SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}


@pytest.mark.parametrize("completion,expected", [
    ('{"name": "Ada", "age": 36}', 1.0),
    ('Here:\n```json\n{"name": "Ada", "age": 36}\n```', 1.0),
    ('<answer>{"name": "Ada", "age": 36}</answer>', 1.0),
    ('{"name": "Ada"}', 0.0),
    ('{"name": "Ada", "age": "36"}', 0.0),
    ('{"name": "Ada", "age": NaN}', 0.0),
    ("[" * 5000 + "]" * 5000, 0.0),  # too deep: refused by the bounded parser, not a RecursionError
    ("not json", 0.0),
    ("", 0.0),
])
def test_json_schema_from_config(completion, expected):
    assert score("json_schema", [completion], schema=SCHEMA) == [expected]


def test_json_schema_from_a_column_as_dict_or_text():
    fn = named_reward("json_schema", schema_column="schema")
    assert fn(['{"a": 1}', '{"a": 1}'], schema=[{"type": "object"}, '{"type": "array"}']) == [1.0, 0.0]
    with pytest.raises(PartialRewardFailure, match="invalid JSON Schema"):
        fn(['{}'], schema=[{"type": 5}])


@pytest.mark.parametrize("completion,how,expected", [
    ("<answer>5</answer>", "answer_tag", 1.0), ("5", "answer_tag", 0.0), ("\\boxed{5}", "boxed", 1.0),
    ("<answer>5</answer>", "auto", 1.0), ("\\boxed{5}", "auto", 1.0), ("five", "auto", 0.0),
])
def test_format(completion, how, expected):
    assert score("format", [completion], answer_format=how) == [expected]


@pytest.mark.parametrize("completion,options,expected", [
    ("one two three", {"target": 5}, 1.0),
    ("w " * 10, {"target": 5}, 0.0),
    ("w " * 7, {"target": 5}, 0.6),
    ("w " * 3, {"target": 5, "mode": "around"}, 0.6),
    ("abcdefghij", {"target": 5, "unit": "chars", "tolerance": 10}, 0.5),
    ("w " * 10_000, {"target": 5}, 0.0),  # bounded below by 0
])
def test_length(completion, options, expected):
    assert score("length", [completion], **options) == [pytest.approx(expected)]


def test_length_in_tokens_reads_completion_ids():
    assert named_reward("length", target=2, unit="tokens")(["x"], completion_ids=[[1, 2, 3]]) == [0.5]


def test_named_rewards_pickle_for_remote_workers():
    fn = named_reward("json_schema", schema=SCHEMA)
    back = pickle.loads(pickle.dumps(fn))
    assert back(['{"name": "a", "age": 1}']) == [1.0]


# ---------------------------------------------------------------------------------------------- config and errors


def _own_rubric() -> Rubric:
    return Rubric([RewardComponent("own", lambda completions, **kw: [1.0] * len(completions))], pass_component="own")


def test_config_entries_mix_with_a_tasks_own_rubric_and_never_take_its_pass():
    rubric = add_rewards(_own_rubric(), [{"fn": "math", "weight": 0.5}, {"fn": "format", "weight": 0.1}])
    assert [c.name for c in rubric.components] == ["own", "math", "format"]
    assert rubric.pass_component == "own"
    assert all(c.pass_threshold == float("-inf") for c in rubric.components[1:])
    (s,) = rubric.score(["\\boxed{2}"], [{"answer": "2"}])
    assert s.passed and s.reward == pytest.approx(1.0 + 0.5 + 0.1)


def test_pass_true_makes_a_config_entry_decide_the_pass():
    rubric = add_rewards(_own_rubric(), [{"fn": "exact", "pass": True}])
    assert rubric.pass_component == "exact"
    assert [s.passed for s in rubric.score(["<answer>a</answer>", "<answer>b</answer>"], [{"answer": "a"}] * 2)] == \
        [True, False]


def test_a_dataset_rubric_passes_on_the_first_correctness_reward_or_the_marked_one():
    r = rubric_from_specs([{"fn": "format", "weight": 0.2}, {"fn": "numeric"}, {"fn": "math"}])
    assert r.pass_component == "numeric"
    r = rubric_from_specs([{"fn": "numeric"}, {"fn": "exact", "pass": True}])
    assert r.pass_component == "exact"
    (s,) = r.score(["<answer>5.0</answer>"], [{"answer": "5"}])
    assert s.components == {"numeric": 1.0, "exact": 0.0} and not s.passed


def test_the_task_answer_format_reaches_every_entry_unless_it_sets_its_own():
    r = rubric_from_specs([{"fn": "exact"}, {"fn": "exact", "name": "tagged", "answer_format": "answer_tag"}],
                          answer_format="last_number")
    assert [c.func.options.answer_format for c in r.components] == ["last_number", "answer_tag"]


@pytest.mark.parametrize("specs,message", [
    # each entry checked by its model (config/reward_options.py): the key path, the value, what is allowed
    ([{"fn": "maths"}], "task.rewards[0].fn: 'maths' is not a reward (did you mean 'math'?); known: math, exact, "
                        "numeric, contains, regex, choice, json_schema, format, length, reward_model, "
                        "embedding_margin"),
    ([{"weight": 1}], "task.rewards[0].fn: missing; known: math, exact"),
    (["math"], "task.rewards[0]: must be a mapping with `fn`"),
    ([{"fn": "math", "timeout_s": "fast"}], "task.rewards[0].timeout_s: 'fast': Input should be a valid number"),
    ([{"fn": "exact", "strip": "yes"}], "task.rewards[0].strip: 'yes': Input should be a valid boolean"),
    ([{"fn": "numeric", "abs_tol": True}], "task.rewards[0].abs_tol: True: Input should be a valid number"),
    ([{"fn": "math", "answer_col": "x"}], "task.rewards[0].answer_col: unknown option (did you mean 'answer_column'?); "
                                          "its options: answer_column, answer_format, timeout_s"),
    ([{"fn": "math", "answer_format": "boxd"}], "task.rewards[0].answer_format: 'boxd': Input should be 'auto', "
                                                "'answer_tag', 'boxed', 'last_line', 'last_number' or 'none' (did you "
                                                "mean 'boxed'?)"),
    ([{"fn": "math", "timeout_s": 0}], "task.rewards[0].timeout_s: 0: Input should be greater than 0"),
    ([{"fn": "regex"}], "task.rewards[0].pattern: Field required"),
    ([{"fn": "regex", "pattern": "(unclosed"}], "pattern '(unclosed' is not a valid regular expression"),
    ([{"fn": "length", "target": 10, "unit": "pages"}],
     "task.rewards[0].unit: 'pages': Input should be 'chars', 'words' or 'tokens'"),
    ([{"fn": "json_schema"}], "json_schema needs exactly one of `schema` (a JSON Schema) or `schema_column`"),
    ([{"fn": "json_schema", "schema": {"type": 5}}], "invalid JSON Schema: 5 is not valid"),
    ([{"fn": "choice", "letters": "abc"}], "letters must be distinct capital letters, got 'abc'"),
    ([{"fn": "reward_model"}], "task.rewards[0].path: Field required"),
    ([{"fn": "math", "weight": "high"}], "task.rewards[0].weight: 'high': Input should be a valid number"),
    ([{"fn": "math", "pass": "yes"}], "task.rewards[0].pass: 'yes': Input should be a valid boolean"),
    ([{"fn": "math", "pass": True}, {"fn": "exact", "pass": True}],
     "only one entry may say `pass: true`, got math, exact"),
    ([{"fn": "math"}, {"fn": "math"}], "reward component names must be unique, got ['math', 'math']; give the entry "
                                       "another `name`"),
    ([{"fn": "format"}, {"fn": "length", "target": 50}],
     "nothing decides the pass: add a correctness reward (math, exact, numeric, contains, regex, choice, json_schema) "
     "or mark one entry `pass: true`"),
])
def test_config_errors_say_what_is_wrong(specs, message):
    with pytest.raises(RewardConfigError) as e:
        rubric_from_specs(specs)
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("entry, message", [
    ({"fn": "maths"}, "task.rewards[0].fn: 'maths' is not a reward (did you mean 'math'?)"),
    ({"fn": "math", "timeout_s": "fast"}, "task.rewards[0].timeout_s: 'fast': Input should be a valid number"),
    ({"fn": "math", "answer_col": "x"}, "task.rewards[0].answer_col: unknown option (did you mean 'answer_column'?)"),
    ({"fn": "math", "answer_format": "boxd"}, "task.rewards[0].answer_format: 'boxd': Input should be 'auto'"),
    ({"fn": "regex"}, "task.rewards[0].pattern: Field required"),
    ({"fn": "json_schema", "schema": {"type": 5}}, "invalid JSON Schema"),
    ({"fn": "choice", "letters": "AA"}, "letters must be distinct capital letters"),
    ({"fn": "reward_model"}, "task.rewards[0].path: Field required"),
    ({"fn": "math", "pass": "yes"}, "task.rewards[0].pass: 'yes': Input should be a valid boolean"),
])
def test_the_config_refuses_what_building_the_rewards_refuses_in_one_line(entry, message):
    """The same models check task.rewards when the config is read (the run's start and --dry-run): no run starts
    with a reward it cannot build (config/reward_options.py, was rewards/named_options.py's own type checks)."""
    import json

    from posttrain.config import ConfigError, load_config

    with pytest.raises(ConfigError) as e:
        load_config(None, [f"task.rewards=[{json.dumps(entry)}]"])
    assert str(e.value) == f"invalid config: {message}" or (message in str(e.value) and "\n" not in str(e.value))


def test_every_reward_a_registry_holds_has_an_options_model():
    from posttrain.config.reward_options import OPTIONS
    from posttrain.rewards.from_config import KNOWN

    assert list(OPTIONS) == KNOWN
    assert all(NAMED_REWARDS[fn].options is OPTIONS[fn] for fn in NAMED_REWARDS)


def test_a_missing_column_names_the_columns_there_are():
    rubric = rubric_from_specs([{"fn": "math", "answer_column": "solutoin"}])
    with pytest.raises(RewardConfigError) as e:
        check_columns(rubric, ["prompt", "question", "solution"])
    assert str(e.value) == ("task.rewards: reward 'math' (math) reads the column 'solutoin', which the rows do not "
                            "have; their columns: prompt, question, solution (did you mean 'solution'?); set the "
                            "entry's answer_column")
    # called anyway (a task file's own rows), the samples fail with the same words
    (s,) = rubric.score(["\\boxed{1}"], [{"prompt": "p", "solution": "1"}])
    assert s.failed and "reads the column 'solutoin', which the rows do not have" in s.error


def test_the_registry_documents_every_reward():
    for fn in NAMED_REWARDS:
        kw = {"regex": {"pattern": "x"}, "json_schema": {"schema": {}}, "length": {"target": 3}}.get(fn, {})
        assert named_reward(fn, **kw).__doc__.strip(), fn
