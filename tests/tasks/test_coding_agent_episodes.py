"""The built-in `coding-agent` task: run_tests, the final grade and the episode metrics, whole scripted episodes
through ToolEnv, the split by repository, demonstrations and the env check."""

from __future__ import annotations

import asyncio
import json
import re

import pytest
from coding_agent_helpers import ScriptedSampler, needs_sandbox, play, run_tool, tool_env

from posttrain.envs.smoke_checks import check_task
from posttrain.tasks.coding_agent import data
from posttrain.tasks.coding_agent.episode import TOOL_NAMES, first_failure
from posttrain.tasks.coding_agent.task import anchor_edit, call, demonstrate, line_edit, make_task
from posttrain.tasks import builtin_task_factory
from posttrain.envs.scoring import scored_by


@pytest.fixture(scope="module")
def task():
    return make_task()


# ---- grading, metrics and whole episodes ------------------------------------------------------------------------


@needs_sandbox
def test_run_tests_counts_and_summarizes(task):
    row = next(r for r in task.train_rows if r["issue_id"] == "ledger:one-decimal-amounts")
    ep = task.episode(row)
    out = asyncio.run(ep.run_tests())
    assert re.match(r"\d passed, \d failed \(of 8 tests\)\nfirst failure: tests/test_\w+\.py::test_\w+ - ", out), out
    assert ep.tests_run == 1
    fix = row["fix"][0]
    run_tool(ep, "edit_file", path=fix["path"], old=fix["old"], new=fix["new"])
    assert asyncio.run(ep.run_tests()) == "all 8 tests pass" and ep.tests_run == 2


def test_first_failure_reads_pytest_summary():
    out = ("____ test_mean ____\n/tests/tests/test_stats.py:7: in test_mean\n    assert mean([1, 2, 3]) == 2\n"
           "E   assert 3.0 == 2\nE    +  where 3.0 = mean([1, 2, 3])\n____ test_var ____\nE   assert 5 == 4\n"
           "=== short test summary info ===\nFAILED ../../tests/tests/test_stats.py::test_mean - assert 3...\n"
           "FAILED ../../tests/tests/test_stats.py::test_var - assert 5 == 4\n")
    assert first_failure(out) == "tests/test_stats.py::test_mean - assert 3.0 == 2"
    err = "E   ImportError: solution module m: SyntaxError\n=== short ===\nERROR ../../tests/tests/test_m.py\n"
    assert first_failure(err) == "tests/test_m.py could not be collected - ImportError: solution module m: SyntaxError"
    assert first_failure("E   TimeoutError\n") == "TimeoutError" and first_failure("") == ""


@needs_sandbox
def test_scripted_episode_resolves_through_tool_env(tiny, task):
    _, tok = tiny
    row = next(r for r in task.train_rows if r["issue_id"] == "shipping:lamp-over-limit")
    fix = row["fix"][0]
    replies = [call("list_files"), call("read_file", path="shipping/order.py"),
               call("edit_file", path=fix["path"], old="/ 999", new="/ 1000"),  # a failed edit: not found
               call("edit_file", path="tests/test_order.py", start_line=1, new="x"),  # refused
               call("run_tests"), call("edit_file", path=fix["path"], old=fix["old"], new=fix["new"]),
               call("run_tests"), call("submit", summary="grams to kg")]
    traj = play(task, tok, row, replies)
    assert traj.passed and traj.reward == 1.0 and traj.reward_components["grading_trust"] >= 0.0
    m = traj.metrics
    assert m["resolved"] == 1.0 and m["turns"] == 8 and m["tests_run_before_submit"] == 2 and m["edits"] == 1
    assert m["verified"] == 1.0 and m["submitted"] == 1.0 and m["tool_errors"] == 2 and m["tool_calls"] == 8
    tool_msgs = [x["content"] for x in traj.messages if x["role"] == "tool"]
    assert "not found" in tool_msgs[2] and "read-only" in tool_msgs[3]
    assert "failed" in tool_msgs[4] and tool_msgs[6].startswith("all ")
    assert traj.feedback.startswith("turn 3: the call edit_file")  # the first failed call, for hint distillation
    _, mask, _ = traj.sequence()  # token fidelity holds across the long episode
    assert sum(mask) == sum(len(t.completion_ids) for t in traj.turns)


@needs_sandbox
def test_no_submit_no_reward_and_submit_ends_the_episode(tiny, task):
    _, tok = tiny
    row = task.train_rows[0]
    demo = demonstrate(row)
    unsubmitted = play(task, tok, row, demo[:-1] + ["I am done."])
    assert unsubmitted.reward == 0.0 and unsubmitted.metrics["resolved"] == 0.0
    assert unsubmitted.reward_components["grading_trust"] == -1.0  # not graded at all
    early = play(task, tok, row, [call("submit"), *demo])  # nothing after submit runs
    assert len(early.turns) == 1 and early.metrics["edits"] == 0 and not early.passed


@needs_sandbox
def test_untouched_code_earns_tests_passed_but_not_issue_tests(tiny, task):
    # The held-out repos' untouched code passes a third or more of the tests; the default reward must not pay for submitting it.
    _, tok = tiny
    for row in [next(r for r in task.eval_rows if r["kind"] == k) for k in ("bug", "deletion")]:
        idle = play(task, tok, row, [call("run_tests"), call("submit")])
        assert idle.reward_components["tests_passed"] > 0.3, row["issue_id"]
        assert idle.reward_components["issue_tests"] == 0.0 and idle.reward == 0.0, row["issue_id"]
        fixed = play(task, tok, row, demonstrate(row, edits="anchors"))
        assert fixed.reward_components["issue_tests"] == 1.0 and fixed.reward == 1.0 and fixed.passed
    old = make_task(reward="tests_passed")
    row = next(r for r in old.eval_rows if r["kind"] == "bug")
    assert play(old, tok, row, [call("submit")]).reward > 0.3  # the earlier reward, kept as an option
    with pytest.raises(ValueError, match="reward must be one of"):
        make_task(reward="resolved")


@needs_sandbox
def test_two_episodes_at_once_do_not_share_state(tiny, task):
    _, tok = tiny
    row = next(r for r in task.train_rows if r["kind"] == "bug")
    env = tool_env(task, tok)
    good, idle = demonstrate(row), [call("list_files"), call("run_tests"), call("submit")]

    async def both():
        return await asyncio.gather(env.rollout(row, ScriptedSampler(tok, good)),
                                    env.rollout(row, ScriptedSampler(tok, idle)))

    a, b = asyncio.run(both())
    a, b = asyncio.run(scored_by(env, [a, b]))
    assert a.passed and not b.passed and b.metrics["edits"] == 0
    assert b.extra["episode_columns"]["final_files"] == row["files"] != a.extra["episode_columns"]["final_files"]
    fresh = next(i for i in data.issues(row["kind"], row["repo"]) if f"{i.repo}:{i.id}" == row["issue_id"])
    assert row["files"] == fresh.sources  # the row the episodes started from is untouched


def test_hack_in_an_edit_zeroes_the_reward(task):
    row = next(r for r in task.train_rows if r["kind"] == "bug")
    path = row["fix"][0]["path"]
    hacked = {**row["files"], path: "import os\nos._exit(0)\n" + row["files"][path]}
    cols = {k: v for k, v in row.items() if k != "prompt"}
    grade = {"score": 1.0, "passed": 8, "total": 8, "trust": "out-of-process", "error": None,
             "per_test": {"t::a": True, "t::b": True}, "start_per_test": {"t::a": False, "t::b": True}}
    honest, hack = task.rubric.score([[{"role": "assistant", "content": ""}]] * 2, [
        {**cols, "final_grade": grade, "final_files": row["files"], "submitted": True},
        {**cols, "final_grade": grade, "final_files": hacked, "submitted": True}])
    assert honest.passed and honest.reward == 1.0
    assert hack.components["hack_flagged"] == 1.0 and hack.reward == 0.0 and not hack.passed


# ---- the task: rows, split, demonstrations, env check -----------------------------------------------------------


def test_rows_split_by_repository_and_prompts_list_files_not_contents(task):
    assert builtin_task_factory("coding-agent") is make_task
    assert task.max_turns == 20 and task.final_tool == "submit" and task.stop == ["</tool_call>"]
    assert [t.__name__ for t in task.tools] == TOOL_NAMES
    train_repos, eval_repos = {r["repo"] for r in task.train_rows}, {r["repo"] for r in task.eval_rows}
    assert not train_repos & eval_repos and eval_repos == {"textkit", "gradebook"}
    assert {r["kind"] for r in task.train_rows} == {r["kind"] for r in task.eval_rows} == {"deletion", "bug"}
    assert len(data.repo_names("bug")) == 3 and sum(r["kind"] == "bug" for r in task.train_rows + task.eval_rows) == 9
    for row in task.train_rows + task.eval_rows:
        text = row["prompt"][0]["content"]
        assert all(p in text for p in row["files"]) and "(read-only)" in text
        assert "def " not in text and "assert" not in text  # the file list, not the contents
    again = make_task()
    assert [r["issue_id"] for r in again.train_rows] == [r["issue_id"] for r in task.train_rows]
    assert {r["repo"] for r in make_task(eval_repos=["ledger"]).eval_rows} == {"ledger"}
    with pytest.raises(ValueError):
        make_task(eval_repos=["nope"])
    with pytest.raises(ValueError, match="max_turns"):
        make_task(max_turns=1)
    bugs_only = make_task(kinds=["bug"], max_turns=3)
    assert {r["kind"] for r in bugs_only.train_rows} == {"bug"} and len(bugs_only.smoke_checks) == 3
    row = bugs_only.train_rows[0]  # a short episode gets a demonstration that fits: edit, run_tests, submit
    assert [json.loads(x[len("<tool_call>"):-len("</tool_call>")])["name"] for x in bugs_only.demonstrate(row)] == \
        ["edit_file", "run_tests", "submit"]
    assert len(demonstrate(row)) == 4 and len(demonstrate(row, 2)) == 2


def first_per_repo(rows):
    """One issue of each repository: the fast suite's sample of a check that `-m slow` runs on every issue."""
    seen: dict[str, dict] = {}
    for r in rows:
        seen.setdefault(r["repo"], r)
    return list(seen.values())


@needs_sandbox
@pytest.mark.parametrize("every", [pytest.param(True, marks=pytest.mark.slow), False], ids=["all", "one-per-repo"])
def test_every_issue_fails_at_the_start_and_its_demonstration_resolves_it(task, every):
    rows = task.train_rows + task.eval_rows
    rows = rows if every else first_per_repo(rows)
    assert every or len({r["repo"] for r in rows}) == 6

    async def grade_all():
        async def one(row):
            ep = task.episode(row)
            start = await ep._grade(dict(ep.repo.sources))
            for e in row["fix"]:
                ep.repo.edit(e["path"], e["new"], e["old"])
            return start, await ep._grade(dict(ep.repo.sources))

        return await asyncio.gather(*(one(r) for r in rows))

    results = asyncio.run(grade_all())
    assert [r["issue_id"] for r, (s, _) in zip(rows, results) if s.score >= 1.0] == []
    assert [(r["issue_id"], f.error) for r, (_, f) in zip(rows, results) if f.score < 1.0] == []
    for row in rows:  # the demonstration is the same fix, as tool calls ending in run_tests and submit
        replies = demonstrate(row)
        assert json.loads(replies[-1][len("<tool_call>"):-len("</tool_call>")])["name"] == "submit"


@needs_sandbox
def test_env_check_passes(task):
    results = check_task(task)
    assert [r.check for r in results if not r.ok] == [] and len(results) == 4



# ---- line-range demonstrations (task.options.demo_edits=lines) --------------------------------------------------


def test_line_edit_replaces_only_the_changed_lines():
    text = "a = 1\ndef f():\n    '''doc'''\n    raise NotImplementedError\n\nb = 2\n"
    le = line_edit(text, "def f():\n    '''doc'''\n    raise NotImplementedError\n",
                   "def f():\n    '''doc'''\n    x = 1\n    return x\n")
    assert le == {"start_line": 4, "end_line": 4, "new": "    x = 1\n    return x\n"}
    # a span inside one line becomes that whole line
    assert line_edit("x = sorted(s, reverse=True)[1:]\ny = 2\n", "sorted(s, reverse=True)", "sorted(s)") == \
        {"start_line": 1, "end_line": 1, "new": "x = sorted(s)[1:]\n"}
    with pytest.raises(ValueError, match="exactly once"):
        line_edit("a\na\n", "a", "b")


@pytest.mark.parametrize("edits", ["lines", "blocks"])
def test_every_line_demonstration_edits_the_file_as_the_text_one_does(task, edits):
    # pure (no grading), so every issue: the line-range edits leave each file exactly as the text edits do. With
    # blocks the new lines sit in a fenced block before the call, read back by the env's own parser.
    from posttrain.envs.tools import parse_calls

    for row in task.train_rows + task.eval_rows:
        by_text, by_lines = task.episode(row), task.episode(row)
        for e in row["fix"]:
            by_text.repo.edit(e["path"], e["new"], e["old"])
        for reply in demonstrate(row, edits=edits):
            (c,), errors = parse_calls(reply)
            assert not errors, errors
            if c["name"] == "edit_file":
                assert "old" not in c["arguments"], c
                assert (reply.startswith("```python\n") and '"new": "```"' in reply) is (edits == "blocks")
                by_lines.repo.edit(**c["arguments"])
        assert by_lines.repo.sources == by_text.repo.sources, row["issue_id"]


def test_anchor_edit_is_the_changed_lines_widened_until_unique():
    text = "def f():\n    raise NotImplementedError\n\ndef g():\n    return 1\n"
    assert anchor_edit(text, "def f():\n    raise NotImplementedError\n", "def f():\n    return 2\n") == \
        {"old": "    raise NotImplementedError\n", "new": "    return 2\n"}
    # the changed line occurs twice: the line above joins the anchor, and the replacement keeps it
    dup = "def f():\n    return 1\n\ndef g():\n    return 1\n"
    assert anchor_edit(dup, "def g():\n    return 1\n", "def g():\n    return 3\n") == \
        {"old": "def g():\n    return 1\n", "new": "def g():\n    return 3\n"}
    # the first line repeated later: widening goes down past the top of the file
    top = "x = 1\ny = 2\nx = 1\n"
    assert anchor_edit(top, "x = 1\ny", "x = 5\ny") == {"old": "x = 1\ny = 2\n", "new": "x = 5\ny = 2\n"}
    # a last line without a newline gets a replacement without one
    assert anchor_edit("a = 1\nb = 2", "b = 2", "b = 3") == {"old": "b = 2", "new": "b = 3"}


def test_every_anchor_demonstration_edits_the_file_as_the_text_one_does(task):
    # Every issue: the short anchored text edits, code in a block, leave each file exactly as the full text edits
    # do, and the anchor is shorter than the text form's `old` (a deletion's anchor is its raise line).
    from posttrain.envs.tools import parse_calls

    for row in task.train_rows + task.eval_rows:
        by_text, by_anchor = task.episode(row), task.episode(row)
        for e in row["fix"]:
            by_text.repo.edit(e["path"], e["new"], e["old"])
        anchors = []
        for reply in demonstrate(row, edits="anchors"):
            (c,), errors = parse_calls(reply)
            assert not errors, errors
            if c["name"] == "edit_file":
                assert reply.startswith("```python\n") and '"new": "```"' in reply
                anchors.append(c["arguments"]["old"])
                by_anchor.repo.edit(**c["arguments"])
        assert by_anchor.repo.sources == by_text.repo.sources, row["issue_id"]
        assert len(anchors) == len(row["fix"]) and all(len(a) <= len(e["old"]) + 80 for a, e in zip(anchors, row["fix"]))
        if row["kind"] == "deletion":
            assert [a.strip() for a in anchors] == ["raise NotImplementedError"], row["issue_id"]


def test_only_the_block_task_tells_the_policy_about_blocks():
    assert "fenced block" in make_task(demo_edits="blocks").train_rows[0]["prompt"][0]["content"]
    anchors = make_task(demo_edits="anchors").train_rows[0]["prompt"][0]["content"]
    assert "fenced block" in anchors and '"old": "    return x\\n", "new": "```"' in anchors
    assert "fenced block" not in make_task().train_rows[0]["prompt"][0]["content"]


@needs_sandbox
@pytest.mark.parametrize("edits", ["lines", "blocks", "anchors"])
def test_env_check_passes_with_line_demonstrations(edits):
    t = make_task(demo_edits=edits)
    assert [r.check for r in check_task(t) if not r.ok] == []
    with pytest.raises(ValueError, match="demo_edits must be one of"):
        make_task(demo_edits="diff")
