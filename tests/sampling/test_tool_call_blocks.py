"""Block arguments: a tool-call argument given as "```" takes a fenced block written before the call, so code needs
no JSON escaping (sampling/tool_calls.py)."""

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.envs.tools import parse_calls
from posttrain.sampling.tool_calls import BLOCK, fenced_block, parse_tool_calls


def _call(name, **arguments):
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def test_a_block_argument_takes_the_code_as_written():
    code = 'def f(s):\n    return s.replace("\\\\", "/") + \'"\'\n'  # quotes and a backslash: JSON would escape them
    reply = "Here is the fix.\n" + fenced_block(code, "python") + _call("edit_file", path="a.py", start_line=3,
                                                                        end_line=4, new=BLOCK)
    content, calls, errors = parse_tool_calls(reply)
    assert errors == [] and content == "Here is the fix."
    assert calls == [{"name": "edit_file", "arguments": {"path": "a.py", "start_line": 3, "end_line": 4, "new": code}}]


def test_two_block_arguments_take_the_blocks_in_order_and_earlier_prose_blocks_stay():
    quoted, old, new = "x = 1\n", "a = 1\n", "a = 2\n"
    reply = ("The file had\n" + fenced_block(quoted) + "so:\n" + fenced_block(old) + fenced_block(new)
             + _call("edit_file", path="a.py", old=BLOCK, new=BLOCK))
    content, calls, errors = parse_tool_calls(reply)
    assert not errors and calls[0]["arguments"] == {"path": "a.py", "old": old, "new": new}
    assert quoted in content and old not in content  # blocks nearest the call are the arguments


def test_each_call_takes_the_blocks_after_the_previous_call():
    reply = (fenced_block("one\n") + _call("w", text=BLOCK) + "\n" + fenced_block("two\n") + _call("w", text=BLOCK))
    _, calls, errors = parse_tool_calls(reply)
    assert not errors and [c["arguments"]["text"] for c in calls] == ["one\n", "two\n"]


def test_a_missing_or_unclosed_block_is_an_error_not_a_call():
    for reply in (_call("edit_file", path="a.py", new=BLOCK),                      # no block at all
                  "```python\ndef f():\n    pass\n" + _call("edit_file", new=BLOCK),  # never closed
                  fenced_block("a\n") + _call("edit_file", old=BLOCK, new=BLOCK)):  # one block for two arguments
        content, calls, errors = parse_tool_calls(reply)
        assert calls == [] and len(errors) == 1 and "fenced block" in errors[0], reply
        assert "<tool_call>" in content  # the broken call stays visible
    assert parse_calls(_call("edit_file", new=BLOCK)) == ([], [parse_tool_calls(_call("edit_file", new=BLOCK))[2][0]])


def test_a_plain_string_argument_is_untouched():
    _, calls, _ = parse_tool_calls(fenced_block("x\n") + _call("w", text="``` not a placeholder"))
    assert calls[0]["arguments"]["text"] == "``` not a placeholder"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(alphabet=st.sampled_from(list("ab `\"'\\\n\t{}<>/é")), max_size=40), min_size=1, max_size=4),
       st.sampled_from(["", "python", " py"]))
def test_any_code_round_trips_through_a_fenced_block(lines, info):
    # Backtick runs, quotes, backslashes, braces, blank lines: what JSON would need escaped comes back exact.
    code = "\n".join(lines) + "\n"
    reply = "prose\n" + fenced_block(code, info) + _call("edit_file", path="a.py", new=BLOCK)
    _, calls, errors = parse_tool_calls(reply)
    assert errors == [] and calls[0]["arguments"]["new"] == code


def test_a_tool_call_quoted_in_a_fenced_block_is_text_not_a_call():
    # Code that itself parses tool calls: its literal tags (one never closed) stay in the block argument.
    code = 'START = "<tool_call>"\nEXAMPLE = "<tool_call>{\\"name\\": \\"rm\\"}</tool_call>"\n'
    reply = "fix:\n" + fenced_block(code, "python") + _call("edit_file", path="p.py", new=BLOCK)
    content, calls, errors = parse_tool_calls(reply)
    assert errors == [] and calls == [{"name": "edit_file", "arguments": {"path": "p.py", "new": code}}]
    # A quoted example in prose: not run, kept in the content, and the real call after it is still parsed.
    reply = "Calls look like\n" + fenced_block(_call("rm", path="/") + "\n") + "so:\n" + _call("ls", path=".")
    content, calls, errors = parse_tool_calls(reply)
    assert errors == [] and calls == [{"name": "ls", "arguments": {"path": "."}}]
    assert '"name": "rm"' in content


FRAGMENTS = ["<tool_call>", "</tool_call>", "```", "\n", "x", '"', "{", "}", " "]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(FRAGMENTS), max_size=30))
def test_any_code_with_tool_call_tags_round_trips_through_a_fenced_block(parts):
    code = "".join(parts) + "\n"
    reply = fenced_block(code, "python") + _call("edit_file", new=BLOCK) + "\n" + _call("ls", path=".")
    _, calls, errors = parse_tool_calls(reply)
    assert errors == [] and calls == [{"name": "edit_file", "arguments": {"new": code}},
                                      {"name": "ls", "arguments": {"path": "."}}]
