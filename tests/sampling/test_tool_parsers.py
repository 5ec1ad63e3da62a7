"""Tool-call parsers by model family (sampling/tool_parsers.py): each format from real-looking replies, hostile
replies bounded, and the family read from a chat template."""

import json
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.sampling.tool_calls import MAX_CALLS, MAX_REPLY_CHARS
from posttrain.sampling.tool_parsers import (
    TOOL_PARSERS,
    detect_tool_parser,
    parse_llama3,
    parse_mistral,
    parse_qwen3_coder,
)

NESTED = {"path": "a.py", "edits": [{"line": 3, "new": 'print("x")'}], "opts": {"dry": False, "n": None}}


def _call(name, **args):
    return {"name": name, "arguments": args}


# ---- each format ---------------------------------------------------------------------------------------------------
def test_hermes_several_calls_with_text_around():
    reply = ("I'll check both.\n<tool_call>\n" + json.dumps({"name": "weather", "arguments": {"city": "Paris"}})
             + "\n</tool_call>\n<tool_call>\n" + json.dumps({"name": "edit", "arguments": NESTED})
             + "\n</tool_call>\nDone.")
    content, calls, errors = TOOL_PARSERS["hermes"].parse(reply, None)
    assert calls == [_call("weather", city="Paris"), _call("edit", **NESTED)] and errors == []
    assert content == "I'll check both.\n\n\nDone."


def test_llama3_json_calls():
    one = json.dumps({"name": "weather", "parameters": {"city": "Paris"}})
    two = json.dumps({"name": "edit", "parameters": NESTED})
    assert parse_llama3(one) == ("", [_call("weather", city="Paris")], [])
    assert parse_llama3("<|python_tag|>" + one) == ("", [_call("weather", city="Paris")], [])
    assert parse_llama3(f"{one}; {two}") == ("", [_call("weather", city="Paris"), _call("edit", **NESTED)], [])
    content, calls, errors = parse_llama3(f"Let me look that up.\n\n<|python_tag|>{two}\nDone")
    assert content == "Let me look that up.\n\n\nDone" and calls == [_call("edit", **NESTED)] and errors == []
    # "arguments" as well as "parameters"; arguments written as a JSON string
    args_str = json.dumps({"name": "w", "arguments": json.dumps({"city": "Oslo"})})
    assert parse_llama3(args_str)[1] == [_call("w", city="Oslo")]


def test_llama3_other_json_is_text_and_a_cut_call_is_an_error():
    answer = 'The record is {"name": "Ada", "born": 1815}.'
    assert parse_llama3(answer) == (answer, [], [])
    assert parse_llama3('{"name": "f", "parameters": [1]}')[1:] == (
        [], ["tool call 'f' arguments must be an object, got list"])
    content, calls, errors = parse_llama3('{"name": "weather", "parameters": {"city": "Par')
    assert calls == [] and len(errors) == 1 and "not valid JSON" in errors[0] and content.startswith('{"name"')


def test_mistral_before_v11_json_list():
    calls_json = json.dumps([{"name": "weather", "arguments": {"city": "Paris"}},
                             {"name": "edit", "arguments": NESTED}])
    content, calls, errors = parse_mistral(f"Checking.[TOOL_CALLS] {calls_json}")
    assert content == "Checking." and calls == [_call("weather", city="Paris"), _call("edit", **NESTED)] and not errors
    assert parse_mistral('[TOOL_CALLS]{"name": "w", "arguments": {}}')[1] == [_call("w")]


def test_mistral_v11_name_args_calls():
    reply = ('[TOOL_CALLS]weather[ARGS]{"city": "Paris"}[TOOL_CALLS]edit[ARGS]' + json.dumps(NESTED))
    assert parse_mistral(reply) == ("", [_call("weather", city="Paris"), _call("edit", **NESTED)], [])
    rome = [_call("weather", city="Rome")]
    assert parse_mistral('[TOOL_CALLS]weather[CALL_ID]a1b2c3d4e[ARGS]{"city": "Rome"}')[1] == rome
    assert parse_mistral('[TOOL_CALLS]weather{"city": "Rome"}')[1] == [_call("weather", city="Rome")]
    assert parse_mistral('[TOOL_CALLS]weather[ARGS]{"city": "Rome"} and more')[0] == "and more"


def test_mistral_broken_calls_are_errors_left_in_the_content():
    for reply in ('[TOOL_CALLS]weather[ARGS]{"city": ', "[TOOL_CALLS]I am not sure {maybe}", "[TOOL_CALLS]just text",
                  '[TOOL_CALLS][{"arguments": {}}]'):
        content, calls, errors = parse_mistral(reply)
        assert calls == [] and len(errors) == 1 and content == reply.strip(), reply
    assert parse_mistral("no calls here") == ("no calls here", [], [])


SCHEMAS = {"edit": {"type": "object", "properties": {
    "path": {"type": "string"}, "line": {"type": "integer"}, "dry": {"type": "boolean"}, "opts": {"type": "object"},
    "ids": {"type": "array"}, "ratio": {"type": ["number", "null"]}, "code": {"type": "string"}}}}


def _xml(name, **params):
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


def test_qwen3_coder_xml_calls_typed_by_the_schema():
    code = 'def f(a, b):\n    return a < b and "<x>" != \'</y>\'\n'
    reply = ("Fixing it.\n" + _xml("edit", path="007.py", line="12", dry="false", opts='{"a": [1, {"b": 2}]}',
                                   ids="[1, 2]", ratio="0.5", code=code) + "\n" + _xml("run", cmd="pytest -q"))
    content, calls, errors = parse_qwen3_coder(reply, SCHEMAS)
    assert errors == [] and content == "Fixing it."
    assert calls == [_call("edit", path="007.py", line=12, dry=False, opts={"a": [1, {"b": 2}]}, ids=[1, 2],
                           ratio=0.5, code=code), _call("run", cmd="pytest -q")]
    # no schema: every value is text; a value that does not read as its type stays text
    assert parse_qwen3_coder(_xml("edit", line="12"))[1] == [_call("edit", line="12")]
    assert parse_qwen3_coder(_xml("edit", line="twelve", ratio="null"), SCHEMAS)[1] == [_call("edit", line="twelve",
                                                                                             ratio=None)]


def test_qwen3_coder_without_the_wrapper_and_broken_calls():
    bare = "<function=ls>\n<parameter=path>\n.\n</parameter>\n</function>"
    assert parse_qwen3_coder(bare)[1] == [_call("ls", path=".")]
    cut = "<tool_call>\n<function=edit>\n<parameter=code>\ndef f("
    assert parse_qwen3_coder(cut) == (cut, [], [f"tool call is not closed with </function>: {cut[12:]}"])
    assert parse_qwen3_coder("<function=>\n</function>")[1:] == (
        [], ["tool call name must be 1 to 256 characters: ''"])
    # a parameter never closed ends where the next one starts (vLLM reads it so too)
    assert parse_qwen3_coder("<function=f><parameter=a>1<parameter=b>2</parameter></function>")[1] == [
        _call("f", a="1", b="2")]


# ---- hostile replies -----------------------------------------------------------------------------------------------
WRITE = {
    "hermes": lambda n, a: "<tool_call>" + json.dumps({"name": n, "arguments": a}) + "</tool_call>",
    "llama3": lambda n, a: json.dumps({"name": n, "parameters": a}),
    "mistral": lambda n, a: f"[TOOL_CALLS]{n}[ARGS]" + json.dumps(a),
    "qwen3_coder": lambda n, a: _xml(n, **a),
}


@pytest.mark.parametrize("family", sorted(TOOL_PARSERS))
def test_at_most_max_calls_are_read(family):
    reply = "\n".join(WRITE[family]("f", {"x": str(i)}) for i in range(MAX_CALLS + 5))
    content, calls, errors = TOOL_PARSERS[family].parse(reply, None)
    assert len(calls) == MAX_CALLS and calls[-1] == _call("f", x=str(MAX_CALLS - 1))
    assert len(errors) == 1 and "more than" in errors[0] and str(MAX_CALLS + 4) in content


@pytest.mark.parametrize("family", sorted(TOOL_PARSERS))
def test_deep_nesting_and_huge_replies_are_bounded(family):
    deep = {"x": json.loads("[" * 60 + "]" * 60)}
    deeper = WRITE[family]("f", {"x": 1}).replace("1", "[" * 100_000 + "]" * 100_000)
    t0 = time.perf_counter()
    assert TOOL_PARSERS[family].parse(WRITE[family]("f", deep), None)[1] != [] or family == "qwen3_coder"
    content, calls, errors = TOOL_PARSERS[family].parse(deeper, None)
    assert calls == [] or family == "qwen3_coder"  # XML values are text: no JSON read without a schema
    huge = TOOL_PARSERS[family].parse("x" * (MAX_REPLY_CHARS + 1) + WRITE[family]("f", {}), None)
    assert huge.calls == [] and "not searched" in huge.errors[0]
    assert time.perf_counter() - t0 < 20  # a hang would be minutes


def test_llama3_many_bad_calls_stop_the_search():
    reply = '{"name": "f", "parameters": {"a": ' * 5000
    t0 = time.perf_counter()
    content, calls, errors = parse_llama3(reply)
    assert calls == [] and len(errors) <= 8 + 1 and content == reply.strip() and time.perf_counter() - t0 < 20


FRAGMENTS = ["<tool_call>", "</tool_call>", "<|python_tag|>", "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "<function=",
             "</function>", "<parameter=", "</parameter>", ">", "{", "}", "[", "]", '"name"', '"arguments"',
             '"parameters"', ":", ",", ";", '"', "\\", "f", "1", " ", "\n", "é", "\ud800", "```"]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(FRAGMENTS), max_size=60), st.sampled_from(sorted(TOOL_PARSERS)))
def test_any_text_never_raises(parts, family):
    text = "".join(parts)
    content, calls, errors = TOOL_PARSERS[family].parse(text, SCHEMAS)
    assert isinstance(content, str) and len(calls) <= MAX_CALLS and all(isinstance(e, str) for e in errors)
    for c in calls:
        assert isinstance(c["name"], str) and 0 < len(c["name"]) <= 256 and isinstance(c["arguments"], dict)
        json.dumps(c["arguments"])  # what the server sends back
    if not calls and not errors:
        assert content == text.strip()


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200), st.sampled_from(sorted(TOOL_PARSERS)))
def test_random_text_never_raises(text, family):
    TOOL_PARSERS[family].parse(text, None)


JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=10),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                       max_size=3), max_leaves=10)
NAMES = st.from_regex(r"[a-z_][a-z0-9_]{0,15}", fullmatch=True)


@settings(max_examples=200, deadline=None)
@given(NAMES, st.dictionaries(NAMES, JSON_VALUES, max_size=4), st.sampled_from(["hermes", "llama3", "mistral"]))
def test_json_arguments_round_trip(name, args, family):
    reply = "Sure.\n" + WRITE[family](name, args)
    content, calls, errors = TOOL_PARSERS[family].parse(reply, None)
    assert (content, calls, errors) == ("Sure.", [_call(name, **args)], [])


@settings(max_examples=200, deadline=None)
@given(NAMES, st.dictionaries(NAMES, st.text(max_size=30).filter(lambda v: "<parameter=" not in v
                                                                     and "</parameter>" not in v
                                                                     and "</function>" not in v), max_size=4))
def test_xml_string_values_round_trip(name, args):
    schemas = {name: {"properties": {k: {"type": "string"} for k in args}}}
    content, calls, errors = parse_qwen3_coder("Sure.\n" + _xml(name, **args), schemas)
    assert (content, calls, errors) == ("Sure.", [_call(name, **args)], [])


# ---- the family of a chat template ---------------------------------------------------------------------------------
SMOLLM2 = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
           "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
           "<|im_end|>\n' }}"
           "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
           "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
TEMPLATES = {
    # excerpts of each family's template: the parts that write (or ask for) its calls
    "qwen3": ('{%- if tools %}...For each function call, return a json object with function name and arguments '
              'within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
              '<args-json-object>}\n</tool_call>{%- endif %}'),
    "llama3.1": ('{%- if builtin_tools is defined or tools is not none %}{{- "Environment: ipython\\n" }}...Given the '
                 'following functions, please respond with a JSON for a function call with its proper arguments...'
                 '{{- "<|python_tag|>" + tool_call.name + ".call(" }}'),
    "mistral": ("{%- if message.tool_calls %}{{- '[TOOL_CALLS]' }}{%- for tool in message.tool_calls %}"
                "{{- tool.name + '[ARGS]' }}"),
    "qwen3_coder": ("<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n"
                    "</parameter>\n</function>\n</tool_call>"),
}


def test_the_family_is_read_from_the_template():
    assert {k: detect_tool_parser(v) for k, v in TEMPLATES.items()} == {
        "qwen3": "hermes", "llama3.1": "llama3", "mistral": "mistral", "qwen3_coder": "qwen3_coder"}
    assert detect_tool_parser(SMOLLM2) == "hermes"  # the default model: no tool markers, the format we prompt for
    assert detect_tool_parser("") == "hermes"
