"""Reasoning parsers (sampling/reasoning_parsers.py): a reply split into reasoning and content, the block opened in
the reply or in the prompt (DeepSeek-R1), and the family read from a chat template."""

from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.sampling.reasoning_parsers import REASONING_PARSERS, detect_reasoning_parser

THINK, MISTRAL, NONE = (REASONING_PARSERS[k] for k in ("think", "mistral", "none"))


def test_a_block_at_the_start_of_the_reply():
    assert THINK.split("<think>\nAdd them.\n</think>\n\nIt is 3.") == ("Add them.", "It is 3.")
    assert THINK.split("\n<think>a</think>b") == ("a", "b")
    assert MISTRAL.split("[THINK]Add them.[/THINK]It is 3.") == ("Add them.", "It is 3.")
    assert THINK.split("<think>\n\n</think>\n\nIt is 3.") == (None, "It is 3.")  # an empty block: no reasoning


def test_a_block_the_prompt_opened_r1():
    tail = "<｜Assistant｜><think>\n"
    assert THINK.split("Add them.\n</think>\n\nIt is 3.", tail) == ("Add them.", "It is 3.")
    assert THINK.split("Still adding", tail) == ("Still adding", "")  # ran out of tokens while thinking
    assert THINK.split("Still adding", "<|im_start|>assistant\n") == (None, "Still adding")


def test_an_end_without_a_start_and_a_start_later_in_the_reply():
    assert THINK.split("Add them.</think>It is 3.") == ("Add them.", "It is 3.")
    later = "It is 3. <think>not reasoning</think>"
    assert THINK.split(later) == ("It is 3. <think>not reasoning", "")  # the end marker closes what came first
    assert THINK.split("It is 3. <think>x") == (None, "It is 3. <think>x")


def test_none_and_plain_replies_are_untouched():
    for text in ("It is 3.", "<think>a</think>b", "  spaced  "):
        assert NONE.split(text, "<think>\n") == (None, text)
    assert THINK.split("  It is 3.  ") == (None, "  It is 3.  ")


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(["<think>", "</think>", "[THINK]", "[/THINK]", "a", " ", "\n", "é"]), max_size=30),
       st.sampled_from(sorted(REASONING_PARSERS)), st.sampled_from(["", "<think>\n", "[THINK]"]))
def test_any_text_splits_into_parts_of_itself(parts, name, tail):
    text = "".join(parts)
    reasoning, content = REASONING_PARSERS[name].split(text, tail)
    assert content in text and (reasoning is None or reasoning in text)
    assert len(content) + len(reasoning or "") <= len(text)


SMOLLM2_END = "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"


def test_the_family_is_read_from_the_template():
    qwen3 = "{%- if reasoning_content %}{{- '<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' }}"
    r1 = "{% if add_generation_prompt %}{{'<｜Assistant｜><think>\\n'}}{% endif %}"
    magistral = "{%- if message.reasoning %}[THINK]{{ message.reasoning }}[/THINK]{%- endif %}"
    assert [detect_reasoning_parser(t) for t in (qwen3, r1, magistral, SMOLLM2_END, "")] == [
        "think", "think", "mistral", "none", "none"]
