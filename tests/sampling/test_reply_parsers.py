"""A completion read as a message (sampling/reply_parsers.py): formats chosen from the tokenizer's template or by
name, markers that are special tokens put back from the ids, and the config's names held equal to the registries."""

import typing

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.config.task import TaskConfig
from posttrain.models.tiny import CHAT_TEMPLATE, tiny_tokenizer
from posttrain.sampling.reasoning_parsers import REASONING_PARSERS
from posttrain.sampling.reply_parsers import (
    ReplyParsers,
    UnknownParser,
    check_parser_names,
    restore_markers,
    skipped_markers,
    template_text,
    tool_schemas,
)
from posttrain.sampling.tool_parsers import TOOL_PARSERS
from posttrain.types import Completion

MARKERS = ["[TOOL_CALLS]", "[ARGS]", "<think>", "</think>"]


def _special_tok(template=CHAT_TEMPLATE + "{# [TOOL_CALLS] [THINK] #}"):
    tok = tiny_tokenizer()
    tok.chat_template = template
    tok.add_special_tokens({"additional_special_tokens": MARKERS})
    return tok


TOK = _special_tok()


def _completion(tok, text, cut=None):
    ids = tok(text, add_special_tokens=False)["input_ids"]
    shown = tok.decode(ids, skip_special_tokens=True)
    return Completion(ids, [0.0] * len(ids), "stop", 0, text=shown if cut is None else shown[:cut])


def test_special_markers_are_put_back_where_their_tokens_sit():
    tok = _special_tok()
    assert set(skipped_markers(tok, MARKERS).values()) == set(MARKERS)
    assert skipped_markers(tiny_tokenizer(), MARKERS) == {}  # held as plain characters: nothing to put back
    text = 'Sure.[TOOL_CALLS]add[ARGS]{"a": 1}[TOOL_CALLS]add[ARGS]{"a": 2}'
    c = _completion(tok, text)
    assert c.text == 'Sure.add{"a": 1}add{"a": 2}'
    assert restore_markers(tok, c.token_ids, c.text, skipped_markers(tok, MARKERS)) == text
    # the text was cut at a stop string: markers past the cut stay out
    c = _completion(tok, text, cut=len('Sure.add{"a": 1}'))
    restored = restore_markers(tok, c.token_ids, c.text, skipped_markers(tok, MARKERS))
    assert restored == 'Sure.[TOOL_CALLS]add[ARGS]{"a": 1}'


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(MARKERS + ["a", "{", "}", " ", "\n", '"']), max_size=30))
def test_any_text_with_markers_round_trips(parts):
    tok = TOK
    text = "".join(parts)
    c = _completion(tok, text)
    assert restore_markers(tok, c.token_ids, c.text, skipped_markers(tok, MARKERS)) == text


def test_parse_reads_reasoning_then_calls_and_not_calls_without_tools():
    tok = _special_tok()
    p = ReplyParsers(tok)
    assert (p.tool.name, p.reasoning.name) == ("mistral", "mistral")
    p = ReplyParsers(tok, reasoning="think")
    c = _completion(tok, '<think>add</think>Sure.[TOOL_CALLS]add[ARGS]{"a": 1}')
    m = p.parse(c, [], tools=True, schemas=None)
    assert (m.reasoning, m.content, m.calls, m.errors) == ("add", "Sure.", [{"name": "add", "arguments": {"a": 1}}], [])
    m = p.parse(c, [], tools=False)
    assert (m.reasoning, m.content, m.calls) == ("add", 'Sure.add{"a": 1}', [])  # as the sampler's text had it


def test_names_are_checked():
    with pytest.raises(UnknownParser, match="unknown tool parser 'gpt'.*hermes, llama3, mistral, qwen3_coder"):
        ReplyParsers(tiny_tokenizer(), tool="gpt")
    with pytest.raises(UnknownParser, match="unknown reasoning parser"):
        check_parser_names("auto", "deepseek")
    check_parser_names("qwen3_coder", "none")


def test_config_names_are_the_registries():
    def choices(field):
        (lit, _none) = typing.get_args(TaskConfig.model_fields[field].annotation)
        return set(typing.get_args(lit))

    assert choices("tool_parser") == {"auto", *TOOL_PARSERS}
    assert choices("reasoning_parser") == {"auto", *REASONING_PARSERS}


def test_template_text_and_tool_schemas():
    class T:
        chat_template = {"default": "a", "tool_use": "<tool_call>"}

    assert template_text(T()) == "a\n<tool_call>"
    T.chat_template = [{"name": "default", "template": "[TOOL_CALLS]"}, {"name": "x"}, "junk"]
    assert template_text(T()) == "[TOOL_CALLS]"
    T.chat_template = None
    assert template_text(T()) == "" and ReplyParsers(T()).tool.name == "hermes"
    params = {"type": "object"}
    assert tool_schemas([{"type": "function", "function": {"name": "a", "parameters": params}},
                         {"type": "function", "name": "b", "parameters": params}, {"name": 3}, "x"]) == {
        "a": params, "b": params}


def test_the_default_model_reads_hermes_calls_and_no_reasoning():
    from transformers import AutoTokenizer

    from posttrain.models.default import DEFAULT_MODEL, models_dir

    folder = models_dir() / DEFAULT_MODEL
    if not (folder / "tokenizer.json").exists():
        pytest.skip("the default model is not converted on this machine")
    p = ReplyParsers(AutoTokenizer.from_pretrained(folder))
    assert (p.tool.name, p.reasoning.name) == ("hermes", "none")
