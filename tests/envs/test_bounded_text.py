"""Bounded host-side work on model text (posttrain.bounded; issue #42, classes 2 and 3).

A policy searches for whatever crashes or stalls the host. Each test here is a measured attack on a host-side parse
of model text, and fails without its defence: deeply nested JSON in a tool call, deeply nested Python in an edit or
in code the hack detector reads, a counted-repeat regex that compiled to gigabytes in the trainer, a regex that
backtracks, fixed regexes that went quadratic on a long line. Timings are generous (the machine is shared).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from posttrain import bounded
from posttrain import bounded_regex
from posttrain.bounded import BoundedError, BoundedTimeout, decode_json_prefix, loads_json, parse_python, walk
from posttrain.bounded_regex import RegexPool, check_pattern
from posttrain.tasks.coding_agent.episode import first_failure
from posttrain.tasks.coding_agent.repo import RepoCopy, hack_flags
from posttrain.tasks import code_tests
from posttrain.envs.tools import ToolError, parse_calls
from posttrain.rewards import json_rewards
from posttrain.rewards.decision import parse_decision
from posttrain.rewards.embedding import split_summaries
from posttrain.rewards.hack_detector import detect_code
from posttrain.sampling.tool_calls import _next_call, fenced_blocks, parse_tool_calls

SLOW_S = 5.0  # "did not stall": every parse here takes milliseconds; the quadratic ones took minutes
MB = 1 << 20


def _rss() -> int:
    return psutil.Process().memory_info().rss


def _timed(fn, *args):
    t = time.monotonic()
    out = fn(*args)
    return out, time.monotonic() - t


def _call(name: str, arguments: str) -> str:
    return f'<tool_call>{{"name": "{name}", "arguments": {arguments}}}</tool_call>'


# ------------------------------------------------------------------------------------------------------------ JSON

@pytest.mark.parametrize("depth", [100, 5000, 200_000])
def test_deeply_nested_json_in_a_tool_call_is_a_parse_error_not_an_exception(depth):
    deep = "[" * depth + "]" * depth
    for reply in (_call("f", f'{{"x": {deep}}}'),  # nested arguments
                  _call("f", '"' + deep + '"'),  # arguments as a JSON string
                  "<tool_call>" + "{" * depth):  # unterminated
        content, calls, errors = parse_tool_calls(reply)
        assert calls == [] and len(errors) == 1, errors
        assert "<tool_call>" in content  # the broken call stays visible
    # the bare-JSON fallback of envs/tools.parse_calls
    assert parse_calls('{"name": "f", "arguments": {"x": ' + deep + "}}") == ([], [])


def test_numbers_json_cannot_hold_are_errors_not_exceptions():
    # An int past Python's 4300-digit conversion limit raises ValueError, not JSONDecodeError; 1e999 decodes to inf.
    for value in ("9" * 5000, "1e999", "-1e999", "NaN", "Infinity"):
        with pytest.raises(BoundedError):
            loads_json(f'{{"x": {value}}}')
        _, calls, errors = parse_tool_calls(_call("f", f'{{"x": {value}}}'))
        assert calls == [] and len(errors) == 1
        assert json_rewards.parse_json_completion(f'{{"x": {value}}}') == (json_rewards.MISSING, 0.0)
    assert loads_json('{"x": 1e300, "y": -0.5, "z": ' + "9" * 4000 + "}")["x"] == 1e300


def test_lone_surrogates_are_invalid_json():
    # "\\ud800" decodes to a str that cannot be encoded as UTF-8: an edit made of it broke the tokenizer downstream.
    for text in ('"\\ud800"', '{"\\udfff": 1}', '["ok", {"a": ["\\ud800x"]}]', '"\ud800"'):
        with pytest.raises(BoundedError, match="surrogate"):
            loads_json(text)
    assert loads_json('"\\ud83d\\ude00"') == "\U0001F600"  # a valid pair is one character
    edit = _call("edit_file", '{"path": "a.py", "old": "x", "new": "\\ud800"}')
    assert parse_tool_calls(edit)[1] == []


def test_json_rewards_and_decisions_take_deep_json_as_invalid():
    deep = "[" * 100_000 + "]" * 100_000
    for text in (deep, f"```json\n{deep}\n```", f"the answer: {deep} done"):
        assert json_rewards.parse_json_completion(text) == (json_rewards.MISSING, 0.0)
    assert json_rewards.json_exact([deep], expected=[[1]]) == [0.0]
    assert parse_decision('{"label": ' + deep + "}", ["a", "b"]) == "not one JSON object"


def test_json_depth_prescan_stops_at_the_end_of_the_first_value():
    assert decode_json_prefix('{"a": "]]]}}}[[["} ' + "[" * 10_000, 0) == ({"a": "]]]}}}[[["}, 18)
    assert loads_json(' "[[[[\\"[[" ') == '[[[["[['
    assert loads_json("[" * 64 + "]" * 64) is not None
    with pytest.raises(BoundedError, match="nested deeper than 64"):
        loads_json("[" * 65 + "]" * 65)
    with pytest.raises(BoundedError, match="characters"):
        loads_json(" " * (bounded.MAX_JSON_CHARS + 1))


# ---------------------------------------------------------------------------------------------------------- Python

DEEP_PYTHON = {  # each under the coding agent's 8000-character edit cap; the interpreter refuses or recurses on each
    "unary": "y = " + "-" * 7000 + "1\n",  # ast.parse: MemoryError (parser stack)
    "binop": "y = " + "1+" * 3000 + "1\n",  # ast.parse: RecursionError (ast construction)
    "attribute": "y = x" + ".a" * 3900 + "\n",  # ast.parse: RecursionError
    "visitor": "y = " + "not " * 1900 + "x\n",  # parses; a recursive NodeVisitor overflows
}


@pytest.mark.parametrize("kind", sorted(DEEP_PYTHON))
def test_deeply_nested_python_in_an_edit_is_a_warning_not_an_exception(kind):
    repo = RepoCopy({"pkg/a.py": "x = 1\n"}, {"tests/test_a.py": "def test_a():\n    pass\n"})
    out = repo.edit("pkg/a.py", new=DEEP_PYTHON[kind], old="x = 1\n")
    assert "warning: pkg/a.py no longer parses" in out
    # the episode's end checks the edited file for hacks: no exception there either
    assert hack_flags({"pkg/a.py": "x = 1\n"}, repo.sources) == []


@pytest.mark.parametrize("kind", sorted(DEEP_PYTHON))
def test_the_hack_detector_takes_deeply_nested_python(kind):
    assert detect_code(DEEP_PYTHON[kind] * 3) == []


def test_a_deep_expression_does_not_hide_a_hack():
    # 900 levels parse fine; the detector's old recursive visitor raised RecursionError on them, so the hack next to
    # them went unflagged (the reward function failed instead of zeroing the sample).
    code = "import sys\nsys.exit(0)\nx = " + "1+" * 900 + "1\n"
    assert {f.kind for f in detect_code(code)} == {"early_exit"}
    assert {f.kind for f in detect_code("import os\nos._exit(0)\n" + DEEP_PYTHON["unary"])} == {"early_exit"}


def test_code_tests_extraction_takes_deep_python_and_nul_bytes():
    for code in [*DEEP_PYTHON.values(), "def f(x):\n    return x\0\n"]:
        assert code_tests.defines(code, "f") is False
        code_tests.extract_code("def f(x):\n" + code)  # no fence: parsed to decide; must not raise


def test_parse_python_caps_and_walk_without_recursion():
    for src, reason in [("x = (", "line 1"), ("x = 1\0", "NUL"), ("x" * (bounded.MAX_PYTHON_CHARS + 1), "characters"),
                        ("y = " + "-" * 20_000 + "1", "nested too deeply"), ("y = " + "1+" * 300 + "1", "deeper than")]:
        with pytest.raises(BoundedError, match=reason):
            parse_python(src)
    tree = parse_python("y = " + "not " * 1900 + "x", max_depth=10_000)
    assert sum(1 for _ in walk(tree)) > 1900  # a tree deeper than the recursion limit, walked
    import ast
    small = parse_python("def f(a):\n    return a + g(b) * 2\n")
    visited: list[str] = []

    class Order(ast.NodeVisitor):
        def generic_visit(self, node):
            visited.append(type(node).__name__)
            super().generic_visit(node)

    Order().visit(small)
    assert [type(n).__name__ for n in walk(small)] == visited  # the order a recursive visitor sees


# ----------------------------------------------------------------------------------------------------------- regex

def _repo() -> RepoCopy:
    return RepoCopy({"pkg/a.py": "def f(x):\n    return x\n" + "a" * 450 + "!\n"},
                    {"tests/test_a.py": "from pkg.a import f\ndef test_f():\n    assert f(1) == 1\n"})


def test_counted_repeat_bomb_in_search_is_a_tool_error_and_host_memory_stays_flat():
    # ((a{100}){100}){100} compiled to ~290 MB in the trainer (nested one level more: gigabytes, in seconds), and
    # the regex module kept the compiled pattern in its cache.
    repo = _repo()
    repo.search("return", use_regex=True)  # the worker is up before the measurement
    before = _rss()
    for bomb in ("((a{100}){100}){100}", "(?:(?:a{255}){255}){255}", "a{1000000}", "(((x{100}){100}){100}){100}"):
        with pytest.raises(ToolError, match="bad regular expression.*counted repeats"):
            repo.search(bomb, True)
    assert _rss() - before < 100 * MB


def test_the_worker_memory_cap_stops_a_bomb_the_precheck_let_through():
    pool = RegexPool(size=1)
    try:
        before = _rss()
        # Time enough that the memory cap, not the clock, is what stops it: with 2 s a loaded CI machine (vLLM
        # servers starting beside this test) hit the time limit first ("took too long"), which proved nothing
        # about the cap.
        with pytest.raises(BoundedError, match="needs more than|died"):
            pool.search("(((a{100}){100}){100}){100}", ["a"], 60.0, precheck=False)
        assert _rss() - before < 100 * MB
        assert pool.search("a+", ["b", "aa"], 2.0).lines == [1]  # a fresh worker serves the next call
        assert pool.started == 2
    finally:
        pool.close()


def test_catastrophic_backtracking_times_out_as_a_tool_error():
    repo = _repo()
    t = time.monotonic()
    with pytest.raises(ToolError, match="took longer than"):
        repo.search(r"(a|aa)+$", use_regex=True)
    assert time.monotonic() - t < SLOW_S
    assert "pkg/a.py:2" in repo.search(r"return \w", use_regex=True)  # the next search works


def test_a_killed_or_hung_worker_is_replaced():
    pool = RegexPool(size=1, grace_s=0.5)
    try:
        assert pool.search("b", ["a", "b"], 1.0).lines == [1]
        idle = pool._idle[0]
        os.kill(idle.proc.pid, signal.SIGKILL)
        idle.proc.poll = lambda: None  # dead, but not reaped yet: it still looks alive when it is handed out
        assert pool.search("b", ["a", "b"], 1.0).lines == [1]
        assert pool.started == 2 and pool._idle[0] is not idle
        hung = pool._idle[0].proc.pid
        os.kill(hung, signal.SIGSTOP)  # alive, never answers: only the wall-clock deadline ends the call
        with pytest.raises(BoundedTimeout):
            pool.search("b", ["a", "b"], 0.5)
        assert not psutil.pid_exists(hung) or psutil.Process(hung).status() == psutil.STATUS_ZOMBIE
        assert pool.search("b", ["a", "b"], 1.0).lines == [1]
        assert pool.started == 3
    finally:
        pool.close()


def test_many_distinct_patterns_grow_no_host_memory_or_cache():
    import regex

    repo = _repo()
    repo.search("x", use_regex=True)
    cache_before, before = len(regex._main._cache), _rss()
    for i in range(300):
        repo.search(f"(return|def) x{{0,{i}}}[a-z]{{{i % 7}}}", use_regex=True)
    assert len(regex._main._cache) == cache_before  # nothing compiled here
    assert _rss() - before < 50 * MB
    assert len(bounded_regex.default_pool()._idle) <= 2


def test_searches_from_many_threads_at_once():
    repo, errors = _repo(), []

    def work(k: int) -> None:
        try:
            for i in range(5):
                out = repo.search(f"return x{{0,{k + i}}}", use_regex=True)
                assert out.startswith("pkg/a.py:2:"), out
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors


WORKER_PARENT = """
import os, sys, time
from posttrain.bounded_regex import RegexPool
pool = RegexPool(size=1)
pool.search("a", ["a"], 5.0)
print(pool._idle[0].proc.pid, flush=True)
if sys.argv[1] == "fork":  # a child keeps the pipe to the worker open: no EOF, only the parent's death tells
    child = os.fork()
    if child == 0:
        os.close(1), os.close(2)  # only the worker's pipes stay open in here
        time.sleep(60)
        os._exit(0)
    print(child, flush=True)
os._exit(0)
"""


@pytest.mark.parametrize("how", ["exit", "fork"])
def test_the_worker_dies_with_its_parent(how):
    out = subprocess.run([sys.executable, "-c", WORKER_PARENT, how], capture_output=True, text=True, timeout=60)
    pids = [int(x) for x in out.stdout.split()]
    worker = pids[0]
    try:
        deadline = time.monotonic() + 10
        while psutil.pid_exists(worker) and psutil.Process(worker).status() != psutil.STATUS_ZOMBIE \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not psutil.pid_exists(worker) or psutil.Process(worker).status() == psutil.STATUS_ZOMBIE
    finally:
        for pid in pids[1:]:
            os.kill(pid, signal.SIGKILL)


def test_check_pattern_refuses_bombs_and_passes_ordinary_patterns():
    for ok in (r"def \w+\(", r"(a|b){3,5}", r"[{}()\[\]]+", r"\p{L}{2,}", r"x{1000}y{1000}", r"(?i)return\s+None",
               r"[a-z]{0,100}(\d{1,3}){1,10}"):
        check_pattern(ok)
    for bomb, why in [("((a{100}){100}){100}", "counted repeats"), ("a{40000}b{40000}", "counted repeats"),
                      ("(" * 30 + "a" + ")" * 30, "nests groups"), ("a" * 2000, "characters"),
                      ("[a]{99999}", "counted repeats"), (r"(\d{1,999}){999}", "counted repeats")]:
        with pytest.raises(BoundedError, match=why):
            check_pattern(bomb)


# ------------------------------------------------------------------- fixed regexes over a long line: linear time

LONG = 200_000
LINEAR_CASES = {  # each took from seconds to many minutes before (quadratic or worse in the line's length)
    "tool call over a whitespace run": lambda: parse_tool_calls("<tool_call>x" + " " * LONG + "y"),
    "fences of many lengths, none closed": lambda: parse_tool_calls("".join("`" * (3 + i) + "\n" for i in range(3000))),
    "bare JSON: braces never closed": lambda: parse_calls("{" * LONG),
    "code block: a long last line": lambda: code_tests.all_code("```" + "a" * LONG),
    "code block: blank lines before def": lambda: code_tests.extract_code("```\n" + "\n" * LONG + "x\n```", "f"),
    "JSON fence around spaces": lambda: json_rewards.parse_json_completion("```\nx" + " " * LONG + "y"),
    "summary line of spaces": lambda: split_summaries(" " * 5000 + "\n" + "*" * LONG),
    "failure line of ../": lambda: first_failure("FAILED " + "../" * LONG),
    "hack detector fallback": lambda: detect_code("def f(:\n" + "\n" * LONG + "def __eq__(" * 20_000),
}


@pytest.mark.parametrize("case", sorted(LINEAR_CASES))
def test_parses_of_model_text_are_linear_time(case):
    _, took = _timed(LINEAR_CASES[case])
    assert took < SLOW_S


# -------------------------------------------------------------------------------------- properties (hypothesis)

FRAGMENTS = ["[", "]", "{", "}", '"', "\\", ",", ":", "1", "1e999", "-", "NaN", "9" * 60, "<tool_call>",
             "</tool_call>", "```", "\n", " ", "(", ")", "+", "not ", "lambda: ", "a.", "\0", "\ud800", '"name"',
             '"arguments"', "def f(", "import sys", "\t", "'", "#"]
ADVERSARIAL = st.lists(st.tuples(st.sampled_from(FRAGMENTS), st.integers(1, 3000)), max_size=6).map(
    lambda parts: "".join(f * n for f, n in parts))
TEXT = st.one_of(st.text(max_size=3000), ADVERSARIAL)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(TEXT)
def test_no_model_text_raises_anything_but_bounded_error_or_stalls(text):
    t = time.monotonic()
    for parse in (loads_json, parse_python, lambda s: decode_json_prefix(s, 0)):
        try:
            parse(text)
        except BoundedError:
            pass
    parse_tool_calls(text)  # never raises at all
    parse_calls(text)
    json_rewards.parse_json_completion(text)
    detect_code(text)
    code_tests.all_code(text)
    assert time.monotonic() - t < SLOW_S


# --------------------------------------------------------- the linear parsers read exactly what the regexes read

OLD_FENCED = re.compile(r"^(`{3,})[^`\n]*\n(.*?)^\1[ \t]*$\n?", re.DOTALL | re.MULTILINE)
OLD_CODE_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:\n[ \t]*```|\Z)", re.DOTALL)
OLD_JSON_FENCE = re.compile(r"\A```[A-Za-z0-9_-]*[ \t]*\n?(.*?)\n?[ \t]*(?:```)?\Z", re.DOTALL)
OLD_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
SMALL = st.lists(st.sampled_from(["```", "````", "`", "\n", " ", "\t", "x", "py", "<tool_call>", "</tool_call>",
                                  '{"name": "f", "arguments": {}}', '"```"', "{", "}"]), max_size=25).map("".join)


@settings(max_examples=400, deadline=None)
@given(SMALL)
def test_linear_fence_and_call_parsers_agree_with_the_regexes(text):
    assert [(s, e, body) for s, e, body in fenced_blocks(text)] == \
        [(m.start(), m.end(), m.group(2)) for m in OLD_FENCED.finditer(text)]
    assert code_tests.fenced_blocks(text) == OLD_CODE_FENCE.findall(text)
    m = OLD_JSON_FENCE.match(text)
    assert json_rewards._fenced_body(text) == (m.group(1) if m else None)
    first = OLD_TOOL_CALL.search(text)
    found = _next_call(text, 0)
    assert (found is None) == (first is None)
    if first is not None:
        assert (found[0], found[2].strip()) == (first.start(), first.group(1).strip())
