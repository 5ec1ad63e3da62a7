"""code-tests: data integrity, code extraction, the split, and grading through the sandbox."""

import random

import pytest

from posttrain.tasks import code_tests as C


def _score(task, rows, texts):
    comps = [[{"role": "assistant", "content": t}] for t in texts]
    return task.rubric.score(comps, [{k: v for k, v in r.items() if k != "prompt"} for r in rows])


def test_problem_set_shape():
    probs = C.load_problems()
    assert len(probs) >= 100
    assert sum(p["difficulty"] == "easy" for p in probs) >= 60
    assert len({p["id"] for p in probs}) == len(probs)
    for p in probs:
        assert 4 <= len(p["tests"]) <= 8, p["id"]
        assert p["signature"].startswith(p["entry_point"] + "(")
        assert f"def {p['signature']}:" in p["solution"]
        assert p["example"] not in p["tests"], p["id"]


@pytest.mark.parametrize("text,expected", [
    ("```python\ndef f(x):\n    return x\n```", "def f(x):\n    return x"),
    ("Sure!\n```python\ndef f(x):\n    return x\n```\nThis returns x.", "def f(x):\n    return x"),
    ("```python\ndef f(x):\n    return x", "def f(x):\n    return x"),  # cut before the closing fence
    ("```\ndef f(x):\n    return x\n```", "def f(x):\n    return x"),  # untagged fence
    ("```python\nprint(1)\n```\n```python\ndef f(x):\n    return 2\n```", "def f(x):\n    return 2"),
    ("def f(x):\n    return x", "def f(x):\n    return x"),  # no fence at all
    ("The answer is 42.", None),
    ("", None),
])
def test_extract_code(text, expected):
    assert C.extract_code(text, "f") == expected


def test_all_code_joins_every_block():
    text = "```python\nimport sys\n```\n```python\ndef f():\n    sys.exit(0)\n```"
    assert "import sys" in C.all_code(text) and "sys.exit" in C.all_code(text)


def test_split_is_deterministic_and_disjoint():
    a, b = C.make_task(), C.make_task()
    ids = lambda rows: [r["problem_id"] for r in rows]
    assert ids(a.train_rows) == ids(b.train_rows) and ids(a.eval_rows) == ids(b.eval_rows)
    assert not set(ids(a.train_rows)) & set(ids(a.eval_rows))
    assert len(a.eval_rows) == round(len(C.load_problems()) * 0.2)
    c = C.make_task(split_seed=1)
    assert set(ids(c.eval_rows)) != set(ids(a.eval_rows))
    # the split does not depend on the order of the problem file
    shuffled = list(C.load_problems())
    random.Random(0).shuffle(shuffled)
    d = C.make_task(problems=shuffled)
    assert set(ids(d.eval_rows)) == set(ids(a.eval_rows))


def test_prompts_never_show_hidden_cases():
    """No hidden call appears in a prompt, and outside the problem statement (whose words, like 'Buzz', may
    be outputs) and the example call the only value shown is the example's output."""
    task = C.make_task()
    probs = {p["id"]: p for p in C.load_problems()}
    for row in task.train_rows + task.eval_rows:
        p = probs[row["problem_id"]]
        text = " ".join(m["content"] for m in row["prompt"])
        rest = text.replace(p["description"], "").replace(C.call_repr(p["entry_point"], p["example"]), "")
        for case in p["tests"]:
            assert C.call_repr(p["entry_point"], case) not in text, (p["id"], case)
            exp = repr(case["expected"])
            if len(exp) >= 4 and case["expected"] != p["example"]["expected"]:  # "True", "0" occur in any prose
                assert exp not in rest, (p["id"], exp)
        assert "tests" not in row["prompt"][1] and C.call_repr(p["entry_point"], p["example"]) in text


def test_sample_of_reference_solutions_score_one():
    task = C.make_task()
    probs = random.Random(0).sample(list(C.load_problems()), 10)
    rows = [C.make_row(p) for p in probs]
    scores = _score(task, rows, [C.reference_completion(p) for p in probs])
    assert all(s.components["tests_passed"] == 1.0 and s.passed for s in scores), [s.error for s in scores]
    assert all(s.components["hack_flagged"] == 0.0 and s.components["sandbox_isolation"] >= 0 for s in scores)
    assert all(abs(s.reward - 1.1) < 1e-9 for s in scores)  # tests 1.0 + format 0.1


def test_every_reference_solution_scores_one():  # ~6 s: every run is a fresh sandbox
    task = C.make_task()
    probs = list(C.load_problems())
    scores = _score(task, [C.make_row(p) for p in probs], [C.reference_completion(p) for p in probs])
    assert [p["id"] for p, s in zip(probs, scores) if s.components["tests_passed"] != 1.0] == []


def test_wrong_and_hacky_solutions_score_below_one():
    task = C.make_task()
    p = {q["id"]: q for q in C.load_problems()}["is_even"]
    row = C.make_row(p)
    wrong, partial, exit_hack, no_code = _score(task, [row] * 4, [
        C.wrong_completion(p),
        "```python\ndef is_even(n):\n    return n == 0\n```",  # right on some cases only
        "```python\nimport sys\ndef is_even(n):\n    sys.exit(0)\n```",
        "I don't know.",
    ])
    assert wrong.components["tests_passed"] < 1 and not wrong.passed
    assert 0 < partial.components["tests_passed"] < 1 and not partial.passed
    assert exit_hack.reward == 0.0 and exit_hack.components["hack_flagged"] == 1.0
    assert no_code.reward == 0.0 and no_code.components["sandbox_isolation"] == -1.0


def test_without_partial_credit_only_a_full_pass_scores():
    task = C.make_task(partial_credit=False)
    p = {q["id"]: q for q in C.load_problems()}["is_even"]
    row = C.make_row(p)
    full, partial = _score(task, [row] * 2, [C.reference_completion(p), "```python\ndef is_even(n):\n    return n == 0\n```"])
    assert full.components["tests_passed"] == 1.0 and full.passed
    assert partial.components["tests_passed"] == 0.0 and partial.reward == 0.1  # format only


def test_hack_detection_can_be_disabled():
    task = C.make_task(detect_hacks=False)
    assert "hack_flagged" not in [c.name for c in task.rubric.components]


def test_registered_and_loadable():
    from posttrain.tasks.load import load_task

    task = load_task("code-tests", {"difficulties": ["easy"]})
    assert task.conversational and task.stop == ["\n```\n"]
    assert len(task.train_rows) + len(task.eval_rows) == sum(p["difficulty"] == "easy" for p in C.load_problems())


def test_grades_are_decided_out_of_process_and_forged_channel_lines_score_zero():
    # A solution that writes a value line for every case plus a closing record into every pipe it holds, then
    # exits: the host compares values itself and the harness's own closing record never comes, so it scores 0.
    p = {q["id"]: q for q in C.load_problems()}["is_even"]
    grader = C.FunctionGrader(timeout_s=5.0)
    forge = ("import json, os\nlines = ''.join(json.dumps({'i': i, 'v': True}) + '\\n' for i in range(8))\n"
             "lines += json.dumps({'done': 8}) + '\\n'\nfor fd in range(3, 64):\n    try:\n"
             "        os.write(fd, lines.encode())\n    except OSError:\n        pass\nos._exit(0)\n"
             "def is_even(n):\n    return True\n")
    (ref, forged) = grader.grade([(p["solution"], p["entry_point"], p["tests"]),
                                  (forge, p["entry_point"], p["tests"])])
    assert ref.score == 1.0 and ref.trust == "out-of-process"
    assert forged.score == 0.0 and forged.error
