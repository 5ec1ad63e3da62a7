"""`reasoning_gym:<dataset>` tasks (tasks/reasoning_gym.py): built offline, scored by the dataset's own scorer, safe on
hostile text, composites mixed by weight, clear errors, and a run that learns."""

import json
import subprocess
import sys
import time
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("reasoning_gym")

from posttrain.envs.smoke_checks import check_task, score_completion  # noqa: E402
from posttrain.envs.task import TaskLoadError  # noqa: E402
from posttrain.tasks import reasoning_gym as rg  # noqa: E402
from posttrain.tasks._reasoning_gym_worker import dataset_for, dumps_entry, loads_entry
from posttrain.tasks.load import load_task  # noqa: E402
from posttrain.tasks.reasoning_gym_screen import EVALS_ARITHMETIC, EVALS_LITERAL, EVALS_SYMBOLIC


@pytest.fixture(autouse=True, scope="module")
def _scorers_end_with_the_module():
    """The process's scorer workers end with this module's tests, not at interpreter exit (after the session's
    check for processes left behind)."""
    yield
    from posttrain.tasks.reasoning_gym_screen import close_scorer_pool

    close_scorer_pool()

# Datasets with one reference answer per question, short prompts, in reasoning-gym 0.1.25.
DATASETS = ["basic_arithmetic", "chain_sum", "leg_counting", "letter_counting", "spell_backward", "word_sorting",
            "gcd", "syllogism", "countdown", "string_insertion"]


def _task(name, **options):
    return load_task(f"reasoning_gym:{name}", {"train_size": 24, "eval_size": 8, **options})


def _score(task, row, text):
    return score_completion(task, row, text)


@pytest.mark.parametrize("name", DATASETS)
def test_builds_offline_with_disjoint_splits_and_its_reference_passes(name):
    task = _task(name)
    assert task.name == f"reasoning_gym:{name}" and len(task.train_rows) == 24 and len(task.eval_rows) == 8
    train_q = {r["prompt"][-1]["content"] for r in task.train_rows}
    assert not train_q & {r["prompt"][-1]["content"] for r in task.eval_rows}
    row = task.eval_rows[0]
    json.dumps(row)  # rows are plain JSON: they travel to env workers and into samples.jsonl
    assert row["prompt"][0]["role"] == "system" and "<answer>" in row["prompt"][0]["content"]
    assert row["rg_dataset"] == name and isinstance(row["answer"], str)
    for r in task.train_rows[:6] + task.eval_rows:
        s = _score(task, r, f"Let me think.\n<answer>{r['answer']}</answer>")
        assert s.passed and s.components == {"rg_score": 1.0, "format": 1.0}, (r["answer"], s)
        assert not _score(task, r, "").passed
    assert all(res.ok for res in check_task(task))  # the smoke checks `posttrain env check` runs


@pytest.mark.parametrize("fmt", ["answer_tag", "boxed", "last_line", "last_number", "none", "auto"])
def test_every_answer_format_is_asked_for_and_read(fmt):
    task = _task("chain_sum", answer_format=fmt)
    row = task.train_rows[0]
    assert rg._INSTRUCTIONS[fmt] in row["prompt"][0]["content"]
    preamble = "" if fmt == "none" else "The sum is\n"  # `none`: the whole reply is the answer
    assert _score(task, row, preamble + rg.format_answer(row["answer"], fmt)).passed
    wrong = str(int(row["answer"]) + 1)
    assert not _score(task, row, rg.format_answer(wrong, fmt)).passed
    assert task.demonstrate(row) == [rg.format_answer(row["answer"], fmt)]


def test_without_the_tag_the_fallback_reads_the_last_number_or_line_and_format_scores_zero():
    task = _task("chain_sum")
    row = task.train_rows[0]
    s = _score(task, row, f"Adding them up, the total is {row['answer']}.")
    assert s.passed and s.components["format"] == 0.0 and s.reward == 1.0
    strict = _task("chain_sum", fallback=False)
    assert not _score(strict, strict.train_rows[0], f"the total is {row['answer']}.").passed
    words = _task("spell_backward")
    r = words.train_rows[0]
    assert _score(words, r, f"Reversed:\n{r['answer']}").passed


def test_partial_credit_is_the_datasets_own_and_only_a_full_score_passes():
    task = _task("leg_counting")
    row = task.train_rows[0]
    s = _score(task, row, f"<answer>{row['answer']} legs</answer>")  # the default scorer's len(ref)/len(answer)
    assert 0 < s.components["rg_score"] < 1 and not s.passed


def test_a_system_prompt_by_reasoning_gym_name_or_text():
    named = _task("gcd", system_prompt="direct").train_rows[0]["prompt"][0]["content"]
    assert named.startswith("Answer the question directly")
    own = _task("gcd", system_prompt="You are terse.").train_rows[0]["prompt"][0]["content"]
    assert own.startswith("You are terse.") and "<answer>" in own


HOSTILE = ["__import__('os').system('touch {marker}')", "open('{marker}', 'w').write('x')",
           "9**9**9**9", "(9**32)**32**32", "9**(9**9)", "1e999999999", "1E-0999999", "exp(10**100)", "N(pi, 10**8)",
           "factorial(10**9)", "99999999!", "0.[3]", "[1]*10**9", "Integral(x, x) + C", "lambda: 1", "{{}}.__class__",
           "-" * 1999 + "x", "(" * 199 + "x" + ")" * 199, "[" * 300 + "]" * 300, "9" * 2000, "x" * 3000, "\x00",
           "nan", "nan+nanj", "<answer>" * 300, "\\boxed{{" * 300, "", " ", "\n" * 500]
EVALUATING = sorted(EVALS_LITERAL | EVALS_ARITHMETIC | EVALS_SYMBOLIC)


@pytest.mark.parametrize("name", EVALUATING + ["coin_flip", "complex_arithmetic", "power_function",
                                               "decimal_arithmetic", "propositional_logic", "word_ladder"])
def test_hostile_answers_score_zero_fast_and_run_nothing(name, tmp_path):
    """Scorers that eval the answer (or parse it with sympy) never see code; numbers that would take the scorer
    minutes in C (1e999999999 in Fraction, 9**9**9 in sympy) never reach it; NaN does not pass."""
    task = load_task(f"reasoning_gym:{name}", {"train_size": 3, "eval_size": 1})
    row = task.train_rows[0]
    marker = tmp_path / "pwned"
    score = task.rubric.components[0].func
    for text in HOSTILE:
        text = text.format(marker=marker)
        t0 = time.monotonic()
        (s,) = task.rubric.score([[{"role": "assistant", "content": f"<answer>{text}</answer>"}]],
                                 [{k: v for k, v in row.items() if k != "prompt"}])
        assert time.monotonic() - t0 < 3.0, text[:40]
        assert not s.failed and s.components["rg_score"] < 0.5 and not s.passed, (text[:40], s)
    assert not marker.exists()
    assert score.counts["timeouts"] == 0


@pytest.mark.parametrize("name", ["basic_arithmetic", "spell_backward", "countdown", "string_insertion",
                                  "polynomial_multiplication", "complex_arithmetic"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(text=st.one_of(st.text(max_size=300), st.text(alphabet="0123456789+-*/()e.x^ ", max_size=120)))
def test_arbitrary_text_scores_in_range_without_raising(name, text):
    task = _cached(name)
    row = task.train_rows[0]
    score = task.rubric.components[0].func
    reply = f"<answer>{text}</answer>"
    (v,) = score([reply], [row["rg_entry"]], [row["rg_spec"]], answer=[row["answer"]])
    assert 0.0 <= v <= 1.0
    if v >= 1.0:  # only a right answer passes
        answer = score.extract(reply, row["answer"])
        assert dataset_for(row["rg_spec"]).score_answer(answer, loads_entry(row["rg_entry"])) >= 1.0


_TASKS: dict = {}


def _cached(name):
    if name not in _TASKS:
        _TASKS[name] = load_task(f"reasoning_gym:{name}", {"train_size": 3, "eval_size": 1})
    return _TASKS[name]


def test_the_screens_let_real_answers_through():
    assert rg.screen("countdown", "94*4 - 61 - 6") and rg.screen("puzzle24", "10*(8 - 5) - 6")
    assert rg.screen("intermediate_integration", "-4*(-2*x - 8)**(3/2)/3 + C")
    assert rg.screen("simple_integration", "-34*x**8/15 - 5*x/4 + C")
    assert rg.screen("polynomial_multiplication", "x**9 - 3*x")
    assert rg.screen("string_insertion", "ABCDE") and rg.screen("spiral_matrix", "[1, 2, 3]")
    assert rg.screen("n_queens", "_ Q _ _\n_ _ _ Q") and rg.screen("binary_matrix", "[[0, 1], [1, 0]]")
    # an unsolved integral would pass intermediate_integration's diff check: only the dataset's reference may hold one
    assert not rg.screen("intermediate_integration", "Integral(x**2, x)")
    assert rg.screen("intermediate_integration", "3*Integral(x, x) + C", reference="3*Integral(x, x) + C")
    assert not rg.screen("complex_arithmetic", "nan") and rg.screen("family_relationships", "Nan", reference="Nan")


def test_complex_arithmetic_nan_does_not_pass():
    """reasoning-gym 0.1.25 scores 'nan' 1.0 there (min(1.0, exp(-nan)) is 1.0): a reward a policy would find."""
    task = _task("complex_arithmetic")
    row = task.train_rows[0]
    ds, entry = dataset_for(row["rg_spec"]), loads_entry(row["rg_entry"])
    assert ds.score_answer("nan", entry) == 1.0  # the dataset's own bug, still there
    assert not _score(task, row, "<answer>nan</answer>").passed


def test_entries_round_trip_through_json_with_tuples_sets_and_int_keys():
    entry = {"answer": "x", "metadata": {"grid": ((1, 2), (3, 4)), "s": {1, 2}, "k": {3: "a", (1, 2): [4]},
                                         "l": [1, (2,)], "__rg_tuple__": 1}}
    assert loads_entry(dumps_entry(entry)) == entry
    task = _task("arc_agi")  # its scorer compares metadata tuples: a lossy encoding fails the reference
    row = task.train_rows[0]
    assert _score(task, row, f"<answer>{row['answer']}</answer>").passed


def test_composite_mixes_by_weight_and_scores_each_row_with_its_own_dataset():
    task = load_task("reasoning_gym:composite", {"train_size": 400, "eval_size": 16, "datasets": {
        "chain_sum": {"weight": 3}, "gcd": {"weight": 1, "config": {"max_value": 50}}}})
    mix = Counter(r["rg_dataset"] for r in task.train_rows)
    assert set(mix) == {"chain_sum", "gcd"} and 0.68 <= mix["chain_sum"] / 400 <= 0.82, mix
    assert all(max(loads_entry(r["rg_entry"])["metadata"]["numbers"]) <= 50  # the sub-dataset's own config
               for r in task.train_rows if r["rg_dataset"] == "gcd")
    for r in [next(r for r in task.eval_rows if r["rg_dataset"] == d) for d in ("chain_sum", "gcd")]:
        assert _score(task, r, f"<answer>{r['answer']}</answer>").passed
        assert not _score(task, r, "<answer>-12345</answer>").passed
    as_list = load_task("reasoning_gym:composite", {"train_size": 20, "eval_size": 4, "datasets": [
        {"name": "chain_sum", "weight": 1}, {"name": "gcd", "weight": 1}]})
    assert {r["rg_dataset"] for r in as_list.train_rows} == {"chain_sum", "gcd"}


@pytest.mark.parametrize("name, options, message", [
    ("leg_countin", {}, "nearest: leg_counting"),
    ("leg_counting", {"max_legs": 3}, "has no option 'max_legs'; its options: min_animals"),
    ("leg_counting", {"min_animals": 5, "max_animals": 2}, "max_animals must be >= min_animals"),
    ("leg_counting", {"size": 10, "train_size": 10}, "train_size or size, not both"),
    ("leg_counting", {"answer_format": "xml"}, "task.options.answer_format: 'xml': Input should be 'auto', "),
    ("leg_counting", {"train_size": 0}, "task.options.train_size: 0: Input should be greater than or equal to 1"),
    ("gcd", {"min_value": 2, "max_value": 3, "train_size": 200, "eval_size": 4},
     "every held-out question also appears"),
    ("composite", {}, "needs task.options.datasets"),
    ("composite", {"datasets": {"chain_sum": {"weight": -1}}}, "weight must be a positive number"),
    ("composite", {"datasets": {"chain_sums": {"weight": 1}}}, "nearest: chain_sum"),
    ("composite", {"datasets": {"gcd": {"config": {"bad": 1}}}},
     "datasets.gcd.config: reasoning-gym dataset 'gcd' has no option 'bad'"),
    ("leg_counting", {"score_timeout_s": "5"}, "task.options.score_timeout_s: '5': Input should be a valid number"),
    ("composite", {"datasets": {"gcd": {"wieght": 2}}}, "unknown keys ['wieght']"),
    ("composite", {"min_value": 3, "datasets": {"gcd": {}}}, "datasets.<name>.config"),
])
def test_bad_names_and_options_are_task_load_errors(name, options, message):
    with pytest.raises(TaskLoadError) as e:
        load_task(f"reasoning_gym:{name}", {"train_size": 8, "eval_size": 2, **options})
    assert message in str(e.value)


def test_without_reasoning_gym_installed_it_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # import raises ImportError
    with pytest.raises(TaskLoadError, match=r"pip install 'posttrain\[reasoning-gym\]'"):
        load_task("reasoning_gym:leg_counting")


# A scorer that hangs or raises: tests/tasks/test_reasoning_gym_worker.py (scorers run in a worker process).


def test_a_scorer_that_passes_anything_or_answers_too_long_to_read_are_warned_about():
    with pytest.warns(UserWarning, match="passes the answer '\\?' on every row"):
        _task("game_of_life_halting")
    with pytest.warns(UserWarning, match="longer than 2000 characters"):
        load_task("reasoning_gym:tower_of_hanoi", {"train_size": 12, "eval_size": 4, "min_disks": 9, "max_disks": 9})


def test_the_row_spec_recreates_the_dataset_in_a_fresh_process():
    """Reward functions see only row columns: another process (a Ray env worker) scores from the row alone."""
    row = _task("word_sorting").train_rows[0]
    code = ("import json, sys; from posttrain.tasks import reasoning_gym as rg; row = json.loads(sys.stdin.read()); "
            "f = rg.ScoreAnswer(); print(f([f\"<answer>{row['answer']}</answer>\", 'no'], [row['rg_entry']] * 2, "
            "[row['rg_spec']] * 2))")
    out = subprocess.run([sys.executable, "-c", code], input=json.dumps(row), capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[1.0, 0.0]"


def test_posttrain_eval_takes_a_reasoning_gym_task():
    r = subprocess.run([sys.executable, "-m", "posttrain.cli", "eval", "--model", "tiny-random", "--task",
                        "reasoning_gym:chain_sum", "--prompts", "2", "--max-tokens", "2", "-o", "train_size=8",
                        "-o", "eval_size=2", "-o", "max_terms=2"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "pass_rate" in r.stdout and "reasoning_gym:chain_sum" in r.stdout


# The learning test. tiny-random (2 layers, random weights, a character tokenizer) cannot reason; what it can learn in
# seconds is the answer a dataset gives most often. letter_counting over 1-3 words answers "1" about 80% of the time,
# and with one new token the reply is the answer: held-out pass goes from 0 to that share only if reasoning-gym's
# scorer signal flows through the loop into the policy.
LEARNING = ["model.name=tiny-random", "task.name=reasoning_gym:letter_counting", "task.options.min_words=1",
            "task.options.max_words=3", "task.options.train_size=48", "task.options.eval_size=16",
            "task.options.answer_format=none", "task.options.max_tokens=1", "loop.eval_prompts=16", "loop.steps=40",
            "loop.prompts_per_step=4", "algorithm.num_generations=8", "trainer.lr=3e-3", "loop.save_every=0",
            "logging.tensorboard=false", "logging.console=false", "diagnostics.remedies.enabled=false"]


def test_grpo_raises_held_out_pass_on_a_reasoning_gym_dataset(tmp_path):
    from posttrain.config import load_config
    from posttrain.loop import train

    res = train(load_config(None, LEARNING + [f"run.output_dir={tmp_path}"]))
    assert res.before["eval/pass_rate"] <= 0.1
    assert res.after["eval/pass_rate"] >= 0.5, (res.before, res.after)


@pytest.mark.slow
def test_two_steps_on_the_default_model_run_end_to_end(tmp_path):
    from posttrain.config import load_config
    from posttrain.loop import train
    from posttrain.obs import read_metrics

    res = train(load_config(None, [
        "task.name=reasoning_gym:chain_sum", "task.options.train_size=16", "task.options.eval_size=4",
        "loop.eval_prompts=4", "loop.steps=2", "loop.prompts_per_step=2", "algorithm.num_generations=4",
        "sampling.max_tokens=48", "loop.save_every=0", "logging.tensorboard=false", "logging.console=false",
        f"run.output_dir={tmp_path}"]))
    recs = [r for r in read_metrics(str(res.run_dir)) if r["kind"] == "train"]
    assert len(recs) == 2 and all(r["rollouts/failed"] == 0 for r in recs)
    assert "eval/pass_rate" in res.before and "eval/pass_rate" in res.after


def test_the_example_config_runs_as_written(tmp_path):
    """configs/reasoning_gym.yaml (docs/reasoning_gym.md), in smoke mode: tiny-random, one step."""
    from pathlib import Path

    from posttrain.config import load_config
    from posttrain.loop import train

    root = Path(__file__).resolve().parents[2]
    assert "configs/reasoning_gym.yaml" in (root / "docs" / "reasoning_gym.md").read_text()
    cfg = load_config(str(root / "configs" / "reasoning_gym.yaml"), [
        "model.name=tiny-random", "loop.steps=1", "loop.eval_prompts=2", "sampling.max_tokens=4",
        "task.options.train_size=16", "task.options.eval_size=2", "logging.tensorboard=false",
        "logging.console=false", "loop.save_every=0", f"run.output_dir={tmp_path}"])
    assert cfg.task.name == "reasoning_gym:chain_sum" and cfg.task.options["max_terms"] == 2
    res = train(cfg)
    assert "eval/pass_rate" in res.after
