"""The built-in `coding-agent` task, its tools: they work on the episode's own repo copy, never touch the host or
the pristine tests, and no argument a policy writes raises out of them or out of the env (property tests).
Episodes, grading and the task's rows: test_coding_agent_episodes.py."""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path

import pytest
from coding_agent_helpers import SOURCES, TESTS, ScriptedSampler, needs_sandbox, run_tool, small_episode, tool_env
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from posttrain.tasks.coding_agent import data
from posttrain.tasks.coding_agent.episode import TOOL_NAMES, RepoEpisode
from posttrain.tasks.coding_agent.repo import MAX_OUTPUT
from posttrain.tasks.coding_agent.task import make_task
from posttrain.envs.tools import Tool, call_tool


@pytest.fixture(scope="module")
def task():
    return make_task()


# ---- tools on the episode's copy ---------------------------------------------------------------------------------


def test_list_read_and_search_the_copy():
    ep = small_episode()
    listing = run_tool(ep, "list_files").content
    assert "pkg/a.py (6 lines)" in listing and "tests/test_a.py (5 lines, read-only)" in listing
    r = run_tool(ep, "read_file", path="pkg/a.py", start_line=2, end_line=2)
    assert r.ok and r.content == "   2|     return x + 1"
    assert run_tool(ep, "read_file", path="./pkg//b.py").content.startswith("   1| from pkg.a import f")
    assert run_tool(ep, "read_file", path="tests/test_a.py").ok  # tests are readable
    hits = run_tool(ep, "search", pattern="return x").content.splitlines()
    assert hits == ["pkg/a.py:2: return x + 1", "pkg/a.py:6: return x + 1"]
    assert run_tool(ep, "search", pattern=r"def \w+\(", regex=True).content.count("\n") == 2  # f, g, test_f
    assert run_tool(ep, "search", pattern="nowhere").content == "no matches for 'nowhere'"
    assert not run_tool(ep, "search", pattern="(", regex=True).ok


def test_edit_string_replace_and_line_range():
    ep = small_episode()
    ambiguous = run_tool(ep, "edit_file", path="pkg/a.py", old="return x + 1", new="return x + 2")
    assert not ambiguous.ok and "matches 2 places" in ambiguous.content and ep.edits == 0
    missing = run_tool(ep, "edit_file", path="pkg/a.py", old="return  x", new="y")
    assert not missing.ok and "not found" in missing.content
    r = run_tool(ep, "edit_file", path="pkg/a.py", old="def g(x):\n    return x + 1", new="def g(x):\n    return x * 2")
    assert r.ok and "return x * 2" in r.content and ep.repo.sources["pkg/a.py"].endswith("return x * 2\n")
    r = run_tool(ep, "edit_file", path="pkg/a.py", start_line=2, end_line=2, new="    return x - 1")
    assert r.ok and ep.repo.sources["pkg/a.py"].startswith("def f(x):\n    return x - 1\n\n")
    assert ep.edits == 2
    both = run_tool(ep, "edit_file", path="pkg/a.py", old="x", start_line=1, new="y")
    assert not both.ok and "not both" in both.content
    outside = run_tool(ep, "edit_file", path="pkg/a.py", start_line=40, new="y")
    assert not outside.ok and "outside" in outside.content
    broken = run_tool(ep, "edit_file", path="pkg/b.py", start_line=3, new="VALUE = f(1")
    assert broken.ok and "no longer parses" in broken.content  # applied, with a warning to recover from


@pytest.mark.parametrize("path", ["/etc/passwd", "../../etc/passwd", "pkg/../../x.py", "~/.bashrc", "C:/x.py",
                                  "", "nope.py", "pkg"])
def test_bad_paths_are_tool_errors(path):
    ep = small_episode()
    for name, args in [("read_file", {}), ("edit_file", {"old": "x", "new": "y"})]:
        r = run_tool(ep, name, path=path, **args)
        assert not r.ok and r.content.startswith(f"error: {name}: ")


def test_bad_arguments_are_tool_errors_not_crashes():
    ep = small_episode()
    for name, args in [("read_file", {"path": 3}), ("read_file", {"path": "pkg/a.py", "start_line": "two"}),
                       ("read_file", {"path": "pkg/a.py", "start_line": True}), ("search", {"pattern": ["x"]}),
                       ("search", {"pattern": "x" * 500}), ("search", {"pattern": "x", "regex": "yes"}),
                       ("edit_file", {"path": "pkg/a.py", "new": 5, "old": "f"}),
                       ("edit_file", {"path": "pkg/a.py", "new": "y"}), ("read_file", {"file": "pkg/a.py"}),
                       ("edit_file", {"path": "pkg/a.py", "new": "x" * 10_000, "old": "f(x)"}),
                       ("run_tests", {}), ("nonexistent", {})]:
        r = run_tool(ep, name, **args)
        assert not r.ok and r.content.startswith("error:"), (name, args, r.content)
    assert ep.repo.sources == SOURCES and ep.repo.tests == TESTS


def test_tests_are_read_only():
    ep = small_episode()
    for path in ["tests/test_a.py", "tests/new.py", "conftest.py", "pkg/test_x.py"]:
        r = run_tool(ep, "edit_file", path=path, start_line=1, new="def test_f():\n    pass\n")
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
    ep = small_episode()
    names = [str(sentinel), "sentinel.txt", f"../{tmp_path.name}/sentinel.txt", str(tmp_path / "new.py"),
             "new.py", "/proc/self/environ", "../" * 12 + "etc/passwd"]
    outputs = [run_tool(ep, "list_files").content, run_tool(ep, "search", pattern="HOST-SECRET").content,
               run_tool(ep, "search", pattern="SECRET", regex=True).content]
    for p in names:
        outputs += [run_tool(ep, "read_file", path=p).content,
                    run_tool(ep, "edit_file", path=p, old="HOST-SECRET-42", new="pwned").content,
                    run_tool(ep, "edit_file", path=p, start_line=1, new="pwned").content]
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


# ---- property: no tool-call argument raises out of the tools or the env -----------------------------------------

SCALARS = st.none() | st.booleans() | st.integers(-10**9, 10**9) | st.floats(allow_nan=True) | st.text(max_size=40)
JSON = SCALARS | st.lists(SCALARS, max_size=3) | st.dictionaries(st.text(max_size=8), SCALARS, max_size=3)
ARG_NAMES = st.sampled_from(["path", "start_line", "end_line", "pattern", "regex", "old", "new", "summary", "x"])
PATHS = st.sampled_from(["pkg/a.py", "pkg/b.py", "tests/test_a.py", "/etc/passwd", "../x", "pkg", ""]) | \
    st.text(max_size=20)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(TOOL_NAMES[:4] + ["submit", "bogus"]),
       args=st.dictionaries(ARG_NAMES, JSON | PATHS | st.integers(-5, 12), max_size=5))
def test_random_tool_calls_never_raise_and_never_touch_the_tests(name, args):
    ep = small_episode()
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
    env = tool_env(task, tok)
    env.episode_factory = lambda row: RepoEpisode(row["files"], {}, grade=None)  # no sandbox: tools only
    traj = asyncio.run(env.rollout(task.train_rows[0], ScriptedSampler(tok, replies + ["done"])))
    assert 1 <= len(traj.turns) <= len(replies) + 1 and traj.metrics["resolved"] == 0.0
