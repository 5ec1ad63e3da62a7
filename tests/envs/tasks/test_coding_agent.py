"""The built-in `coding-agent` task: tools on the episode's own repo copy, isolation from the host and from the
pristine tests, grading, metrics, scripted ToolEnv episodes, the split by repository, and a property test."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from posttrain.envs.check import check_task
from posttrain.envs.coding_agent import data
from posttrain.envs.coding_agent.episode import TOOL_NAMES, RepoEpisode, first_failure
from posttrain.envs.coding_agent.repo import MAX_OUTPUT
from posttrain.envs.coding_agent.task import call, demonstrate, make_task
from posttrain.envs.tasks import builtin_task_factory
from posttrain.envs.tool_env import ToolEnv
from posttrain.envs.tools import Tool, call_tool
from posttrain.sampling.scripted import ScriptedSampler as _Scripted
from posttrain.types import SampleParams

SOURCES = {"pkg/__init__.py": "", "pkg/a.py": "def f(x):\n    return x + 1\n\n\ndef g(x):\n    return x + 1\n",
           "pkg/b.py": "from pkg.a import f\n\nVALUE = f(1)\n"}
TESTS = {"tests/test_a.py": "from pkg.a import f\n\n\ndef test_f():\n    assert f(1) == 2\n"}


def _sandbox_reason() -> str | None:
    from posttrain.sandbox import SandboxConfig
    from posttrain.sandbox.backends import resolve_backend

    try:
        resolve_backend(SandboxConfig())
    except Exception as e:  # noqa: BLE001 - SandboxUnavailable and friends: no isolating backend here
        return str(e)[:200]
    return None


needs_sandbox = pytest.mark.skipif(_sandbox_reason() is not None, reason=f"no sandbox: {_sandbox_reason()}")


@pytest.fixture(scope="module")
def task():
    return make_task()


def _ep() -> RepoEpisode:
    return RepoEpisode(SOURCES, TESTS, grade=None)


def _run(ep: RepoEpisode, name: str, **args):
    """One call the way ToolEnv makes it: through call_tool, so errors come back as results."""
    tools = {t.name: t for t in map(Tool.from_function, ep.tools)}
    return asyncio.run(call_tool(tools, {"name": name, "arguments": args}, 10.0))


def ScriptedSampler(tok, replies):  # noqa: N802 - ends each turn as the model would (after the stop string)
    return _Scripted(tok, replies, end_token_id=tok.convert_tokens_to_ids("<|im_end|>"), stop_ends_reply=True)


def _env(task, tok) -> ToolEnv:
    return ToolEnv(task, tok, SampleParams(max_tokens=task.max_tokens, stop=task.stop), task.tools,
                   max_turns=task.max_turns, final_tool=task.final_tool, tool_timeout_s=task.tool_timeout_s)


def _episode(task, tok, row, replies):
    env = _env(task, tok)
    traj = asyncio.run(env.rollout(row, ScriptedSampler(tok, replies)))
    asyncio.run(env.score([traj]))
    return traj


# ---- tools on the episode's copy ---------------------------------------------------------------------------------


def test_list_read_and_search_the_copy():
    ep = _ep()
    listing = _run(ep, "list_files").content
    assert "pkg/a.py (6 lines)" in listing and "tests/test_a.py (5 lines, read-only)" in listing
    r = _run(ep, "read_file", path="pkg/a.py", start_line=2, end_line=2)
    assert r.ok and r.content == "   2|     return x + 1"
    assert _run(ep, "read_file", path="./pkg//b.py").content.startswith("   1| from pkg.a import f")
    assert _run(ep, "read_file", path="tests/test_a.py").ok  # tests are readable
    hits = _run(ep, "search", pattern="return x").content.splitlines()
    assert hits == ["pkg/a.py:2: return x + 1", "pkg/a.py:6: return x + 1"]
    assert _run(ep, "search", pattern=r"def \w+\(", regex=True).content.count("\n") == 2  # f, g, test_f
    assert _run(ep, "search", pattern="nowhere").content == "no matches for 'nowhere'"
    assert not _run(ep, "search", pattern="(", regex=True).ok


def test_edit_string_replace_and_line_range():
    ep = _ep()
    ambiguous = _run(ep, "edit_file", path="pkg/a.py", old="return x + 1", new="return x + 2")
    assert not ambiguous.ok and "matches 2 places" in ambiguous.content and ep.edits == 0
    missing = _run(ep, "edit_file", path="pkg/a.py", old="return  x", new="y")
    assert not missing.ok and "not found" in missing.content
    r = _run(ep, "edit_file", path="pkg/a.py", old="def g(x):\n    return x + 1", new="def g(x):\n    return x * 2")
    assert r.ok and "return x * 2" in r.content and ep.repo.sources["pkg/a.py"].endswith("return x * 2\n")
    r = _run(ep, "edit_file", path="pkg/a.py", start_line=2, end_line=2, new="    return x - 1")
    assert r.ok and ep.repo.sources["pkg/a.py"].startswith("def f(x):\n    return x - 1\n\n")
    assert ep.edits == 2
    both = _run(ep, "edit_file", path="pkg/a.py", old="x", start_line=1, new="y")
    assert not both.ok and "not both" in both.content
    outside = _run(ep, "edit_file", path="pkg/a.py", start_line=40, new="y")
    assert not outside.ok and "outside" in outside.content
    broken = _run(ep, "edit_file", path="pkg/b.py", start_line=3, new="VALUE = f(1")
    assert broken.ok and "no longer parses" in broken.content  # applied, with a warning to recover from


@pytest.mark.parametrize("path", ["/etc/passwd", "../../etc/passwd", "pkg/../../x.py", "~/.bashrc", "C:/x.py",
                                  "", "nope.py", "pkg"])
def test_bad_paths_are_tool_errors(path):
    ep = _ep()
    for name, args in [("read_file", {}), ("edit_file", {"old": "x", "new": "y"})]:
        r = _run(ep, name, path=path, **args)
        assert not r.ok and r.content.startswith(f"error: {name}: ")


def test_bad_arguments_are_tool_errors_not_crashes():
    ep = _ep()
    for name, args in [("read_file", {"path": 3}), ("read_file", {"path": "pkg/a.py", "start_line": "two"}),
                       ("read_file", {"path": "pkg/a.py", "start_line": True}), ("search", {"pattern": ["x"]}),
                       ("search", {"pattern": "x" * 500}), ("search", {"pattern": "x", "regex": "yes"}),
                       ("edit_file", {"path": "pkg/a.py", "new": 5, "old": "f"}),
                       ("edit_file", {"path": "pkg/a.py", "new": "y"}), ("read_file", {"file": "pkg/a.py"}),
                       ("edit_file", {"path": "pkg/a.py", "new": "x" * 10_000, "old": "f(x)"}),
                       ("run_tests", {}), ("nonexistent", {})]:
        r = _run(ep, name, **args)
        assert not r.ok and r.content.startswith("error:"), (name, args, r.content)
    assert ep.repo.sources == SOURCES and ep.repo.tests == TESTS


def test_tests_are_read_only():
    ep = _ep()
    for path in ["tests/test_a.py", "tests/new.py", "conftest.py", "pkg/test_x.py"]:
        r = _run(ep, "edit_file", path=path, start_line=1, new="def test_f():\n    pass\n")
        assert not r.ok and ("read-only" in r.content or "no file" in r.content)
    assert ep.repo.tests == TESTS and ep.edits == 0


# ---- the host and the pristine tests are out of reach -----------------------------------------------------------


def _tree_hash(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts:
            h.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def test_tools_never_touch_the_host(tmp_path, monkeypatch):
    sentinel = tmp_path / "sentinel.txt"
    sentinel.write_text("HOST-SECRET-42")
    monkeypatch.chdir(tmp_path)  # a relative path that resolved on the host would find it here
    ep = _ep()
    names = [str(sentinel), "sentinel.txt", f"../{tmp_path.name}/sentinel.txt", str(tmp_path / "new.py"),
             "new.py", "/proc/self/environ", "../" * 12 + "etc/passwd"]
    outputs = [_run(ep, "list_files").content, _run(ep, "search", pattern="HOST-SECRET").content,
               _run(ep, "search", pattern="SECRET", regex=True).content]
    for p in names:
        outputs += [_run(ep, "read_file", path=p).content,
                    _run(ep, "edit_file", path=p, old="HOST-SECRET-42", new="pwned").content,
                    _run(ep, "edit_file", path=p, start_line=1, new="pwned").content]
    assert not any("HOST-SECRET-42" in o for o in outputs)
    assert sentinel.read_text() == "HOST-SECRET-42" and sorted(x.name for x in tmp_path.iterdir()) == ["sentinel.txt"]
    assert ep.repo.sources == SOURCES and ep.repo.tests == TESTS


@needs_sandbox
def test_packaged_repos_unchanged_and_episode_test_copies_cannot_change_a_grade(task):
    roots = [data.BUG_REPOS] + [data.fd.REPOS]
    before = [_tree_hash(r) for r in roots]
    row = next(r for r in task.train_rows if r["kind"] == "bug")
    ep = task.episode(row)
    # Even a copy of the tests changed behind the tools' back (edit_file refuses to) grades nothing: the grader
    # reads the packaged tests.
    for path in ep.repo.tests:
        ep.repo.tests[path] = "def test_free():\n    pass\n"
    for path, text in ep.repo.sources.items():  # and the agent's sources land nowhere on the host
        ep.repo.sources[path] = text + "\nopen('/tmp/pwned-by-coding-agent', 'w').write('x')\n"
    out = asyncio.run(ep.run_tests())
    end = asyncio.run(ep.finish({"name": "submit", "arguments": {}}))
    assert "failed" in out and end.columns["final_grade"]["score"] < 1.0 and end.metrics["resolved"] == 0.0
    assert data.pristine_tests(row["kind"], row["repo"]) != ep.repo.tests
    assert [_tree_hash(r) for r in roots] == before and not Path("/tmp/pwned-by-coding-agent").exists()


# ---- grading, metrics and whole episodes ------------------------------------------------------------------------


@needs_sandbox
def test_run_tests_counts_and_summarizes(task):
    row = next(r for r in task.train_rows if r["issue_id"] == "ledger:one-decimal-amounts")
    ep = task.episode(row)
    out = asyncio.run(ep.run_tests())
    assert re.match(r"\d passed, \d failed \(of 8 tests\)\nfirst failure: tests/test_\w+\.py::test_\w+ - ", out), out
    assert ep.tests_run == 1
    fix = row["fix"][0]
    _run(ep, "edit_file", path=fix["path"], old=fix["old"], new=fix["new"])
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
    traj = _episode(task, tok, row, replies)
    assert traj.passed and traj.reward == 1.0 and traj.reward_components["grading_trust"] >= 0.0
    m = traj.metrics
    assert m["resolved"] == 1.0 and m["turns"] == 8 and m["tests_run_before_submit"] == 2 and m["edits"] == 1
    assert m["verified"] == 1.0 and m["submitted"] == 1.0 and m["tool_errors"] == 2 and m["tool_calls"] == 8
    tool_msgs = [x["content"] for x in traj.extra["messages"] if x["role"] == "tool"]
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
    unsubmitted = _episode(task, tok, row, demo[:-1] + ["I am done."])
    assert unsubmitted.reward == 0.0 and unsubmitted.metrics["resolved"] == 0.0
    assert unsubmitted.reward_components["grading_trust"] == -1.0  # not graded at all
    early = _episode(task, tok, row, [call("submit"), *demo])  # nothing after submit runs
    assert len(early.turns) == 1 and early.metrics["edits"] == 0 and not early.passed


@needs_sandbox
def test_two_episodes_at_once_do_not_share_state(tiny, task):
    _, tok = tiny
    row = next(r for r in task.train_rows if r["kind"] == "bug")
    env = _env(task, tok)
    good, idle = demonstrate(row), [call("list_files"), call("run_tests"), call("submit")]

    async def both():
        return await asyncio.gather(env.rollout(row, ScriptedSampler(tok, good)),
                                    env.rollout(row, ScriptedSampler(tok, idle)))

    a, b = asyncio.run(both())
    asyncio.run(env.score([a, b]))
    assert a.passed and not b.passed and b.metrics["edits"] == 0
    assert b.extra["episode_columns"]["final_files"] == row["files"] != a.extra["episode_columns"]["final_files"]
    fresh = next(i for i in data.issues(row["kind"], row["repo"]) if f"{i.repo}:{i.id}" == row["issue_id"])
    assert row["files"] == fresh.sources  # the row the episodes started from is untouched


def test_hack_in_an_edit_zeroes_the_reward(task):
    row = next(r for r in task.train_rows if r["kind"] == "bug")
    path = row["fix"][0]["path"]
    hacked = {**row["files"], path: "import os\nos._exit(0)\n" + row["files"][path]}
    cols = {k: v for k, v in row.items() if k != "prompt"}
    grade = {"score": 1.0, "passed": 8, "total": 8, "trust": "out-of-process", "error": None}
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


@needs_sandbox
def test_every_issue_fails_at_the_start_and_its_demonstration_resolves_it(task):
    rows = task.train_rows + task.eval_rows

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


# ---- property: no tool-call argument raises out of the tools or the env -----------------------------------------

SCALARS = st.none() | st.booleans() | st.integers(-10**9, 10**9) | st.floats(allow_nan=True) | st.text(max_size=40)
JSON = SCALARS | st.lists(SCALARS, max_size=3) | st.dictionaries(st.text(max_size=8), SCALARS, max_size=3)
ARG_NAMES = st.sampled_from(["path", "start_line", "end_line", "pattern", "regex", "old", "new", "summary", "x"])
PATHS = st.sampled_from(["pkg/a.py", "pkg/b.py", "tests/test_a.py", "/etc/passwd", "../x", "pkg", ""]) | st.text(max_size=20)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(TOOL_NAMES[:4] + ["submit", "bogus"]),
       args=st.dictionaries(ARG_NAMES, JSON | PATHS | st.integers(-5, 12), max_size=5))
def test_random_tool_calls_never_raise_and_never_touch_the_tests(name, args):
    ep = _ep()
    tools = {t.name: t for t in map(Tool.from_function, ep.tools)}
    r = asyncio.run(call_tool(tools, {"name": name, "arguments": args}, 5.0))
    assert isinstance(r.content, str) and len(r.content) <= MAX_OUTPUT + 200
    assert ep.repo.tests == TESTS and set(ep.repo.sources) == set(SOURCES)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(replies=st.lists(st.one_of(
    st.builds(lambda n, a: f"<tool_call>{json.dumps({'name': n, 'arguments': a})}</tool_call>",
              st.sampled_from(TOOL_NAMES[:4] + ["bogus"]), st.dictionaries(ARG_NAMES, JSON | PATHS, max_size=4)),
    st.text(max_size=30).map(lambda t: f"<tool_call>{t}</tool_call>")), min_size=1, max_size=4))
def test_random_replies_never_raise_out_of_the_env(tiny, task, replies):
    _, tok = tiny
    env = _env(task, tok)
    env.episode_factory = lambda row: RepoEpisode(row["files"], {}, grade=None)  # no sandbox: tools only
    traj = asyncio.run(env.rollout(task.train_rows[0], ScriptedSampler(tok, replies + ["done"])))
    assert 1 <= len(traj.turns) <= len(replies) + 1 and traj.metrics["resolved"] == 0.0
