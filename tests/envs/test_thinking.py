"""Thinking models in ToolEnv (issue 61): with Qwen3's and DeepSeek-R1's chat templates (tests/fixtures/templates/,
installed on the default tokenizer), `thinking: split` trains every context the model was given, as its template
renders the history (a new chain where the template drops a turn's reasoning), and `thinking: keep` renders every
turn's reasoning with a variant of the template, for sampling and training alike: one chain."""

import asyncio

import pytest
from fixtures.templates.thinking_tokenizers import DROPS_TURNS, TEMPLATES, rewriting_qwen3, thinking_tokenizer

from posttrain.envs.task import Task
from posttrain.envs.tool_env import ToolEnv
from posttrain.models.template_check import (
    ChatTemplateError,
    ThinkingTemplateError,
    check_thinking_template,
    keep_reasoning_template,
)
from posttrain.rewards.rubric import RewardComponent, Rubric
from posttrain.sampling.scripted import ScriptedSampler
from posttrain.types import SampleParams, sequences_of

CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'


def add(a: int, b: int = 0) -> int:
    """Add two numbers.

    Args:
        a: first number
        b: second number
    """
    return a + b


def _task(thinking: str) -> Task:
    def correct(completions, answer, **kw):
        return [float(c[0]["content"].strip() == a) for c, a in zip(completions, answer)]

    rows = [{"prompt": [{"role": "user", "content": "2+3?"}], "answer": "5"}]
    task = Task("t", rows, rows, Rubric([RewardComponent("correct", correct)]))
    task.thinking = thinking
    return task


def _episode(name: str, thinking: str, replies: list[str]):
    tok = thinking_tokenizer(name)
    env = ToolEnv(_task(thinking), tok, SampleParams(max_tokens=64), [add], max_turns=4)
    sampler = ScriptedSampler(tok, replies)
    row = env.task.train_rows[0]
    return env, tok, sampler, row, asyncio.run(env.rollout(row, sampler))


def _rendered_before_each_turn(env: ToolEnv, row, traj) -> list[str]:
    """What the template renders as the prompt of each model call: the history up to that call, re-rendered."""
    msgs = env.initial_messages(row)[:1] + traj.messages
    template = getattr(env, "template", None)
    kw = {"chat_template": template} if template is not None else {}
    return [
        env.tok.apply_chat_template(msgs[:i], tokenize=False, add_generation_prompt=True, **kw)
        for i, m in enumerate(msgs)
        if m["role"] == "assistant"
    ]


def assert_trains_only_what_the_model_saw(env, tok, sampler, row, traj):
    """Every trained context is a prompt the sampler was given, token for token, and that prompt is what the
    template renders for the history at that call (no reasoning kept that the template drops)."""
    chains = [traj.turns, *traj.extra_chains]
    turns = sorted((t for ch in chains for t in ch), key=lambda t: sampler.prompts.index(t.prompt_ids))
    assert [t.prompt_ids for t in turns] == sampler.prompts
    for seq, chain in zip(sequences_of(traj), chains, strict=True):
        for t in chain:
            assert (seq.prompt_ids + seq.completion_ids)[: len(t.prompt_ids)] == t.prompt_ids
    assert [tok.decode(p) for p in sampler.prompts] == _rendered_before_each_turn(env, row, traj)


R1_THINK = [f"<think>\nI should add.\n</think>\n\n{CALL}", "<think>\nThe tool says 5.\n</think>\n\n5"]


@pytest.mark.parametrize(
    ("name", "thinking", "replies", "chains"),
    [
        ("qwen3", "split", R1_THINK, 1),  # Qwen3 keeps reasoning after the last user query: one chain
        ("qwen3", "split", [f"<think>\n\n</think>\n\n{CALL}", "<think>\nIt is 5.\n</think>\n\n5"], 2),
        ("qwen3", "keep", [f"<think>\n\n</think>\n\n{CALL}", "<think>\nIt is 5.\n</think>\n\n5"], 1),
        ("deepseek_r1", "split", R1_THINK, 2),  # R1 drops the first turn's reasoning
        ("deepseek_r1", "keep", R1_THINK, 1),
    ],
)
def test_tool_env_trains_each_context_the_thinking_model_saw(name, thinking, replies, chains):
    env, tok, sampler, row, traj = _episode(name, thinking, replies)
    assert traj.stop_reason == "answer" and len(sampler.prompts) == 2
    assert_trains_only_what_the_model_saw(env, tok, sampler, row, traj)
    assert len(traj.extra_chains) + 1 == chains == traj.metrics["chains"]
    if chains == 1:  # keep: the reasoning of the first turn is in the context of the second
        assert "I should add." in tok.decode(traj.turns[-1].prompt_ids) or "<think>\n\n</think>" in tok.decode(
            traj.turns[-1].prompt_ids
        )


def test_template_check_refuses_what_neither_mode_can_train():
    tok = thinking_tokenizer("qwen3")
    with pytest.raises(ThinkingTemplateError, match="rewrites more than the reasoning") as e:
        ToolEnv(_task("split"), _with_template(tok, rewriting_qwen3()), SampleParams(), [add])
    assert "thinking" in e.value.fix
    with pytest.raises(ChatTemplateError, match="not prefix-stable") as e:  # no reasoning block: the token check
        ToolEnv(_task("split"), _with_template(tok, DROPS_TURNS), SampleParams(), [add])
    assert e.value.fix
    # a template that drops reasoning in a way no known rewrite undoes: keep is refused at start, split trains
    odd = (
        (TEMPLATES / "deepseek_r1.jinja")
        .read_text()
        .replace(
            "{% set content = content.split('</think>')[-1] %}",
            "{% set content = (content.split('</think>') | last) %}",
        )
    )
    odd_tok = _with_template(tok, odd)
    assert keep_reasoning_template(odd) == odd
    with pytest.raises(ThinkingTemplateError, match="no known rewrite") as e:
        ToolEnv(_task("keep"), odd_tok, SampleParams(), [add])
    assert check_thinking_template(odd_tok, "split") is None


def _with_template(tok, template: str):
    import copy

    other = copy.copy(tok)
    other.chat_template = template
    return other


def test_task_thinking_comes_from_the_config():
    from posttrain.config.schema import TaskConfig
    from posttrain.tasks.from_config import task_from_config

    assert task_from_config(TaskConfig()).thinking == "split"  # the task's own default
    assert task_from_config(TaskConfig(thinking="keep")).thinking == "keep"
    with pytest.raises(ValueError, match="thinking"):
        TaskConfig(thinking="drop")
