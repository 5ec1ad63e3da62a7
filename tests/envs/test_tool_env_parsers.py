"""ToolEnv reads each turn with the model family's formats (sampling/reply_parsers.py): the `<tool_call>` JSON its
own system prompt asks for, else the family's own calls (detected from the chat template, or `task.tool_parser`);
a call written inside the reasoning is not run."""

import asyncio

import pytest

from posttrain.config.schema import TaskConfig
from posttrain.envs.task import Task
from posttrain.envs.tool_env import ToolEnv
from posttrain.models.tiny import CHAT_TEMPLATE, tiny_tokenizer
from posttrain.rewards.rubric import RewardComponent, Rubric
from posttrain.sampling.scripted import ScriptedSampler
from posttrain.types import SampleParams

LLAMA3 = CHAT_TEMPLATE + "{# <|python_tag|> #}"
QWEN3 = CHAT_TEMPLATE + "{# <tool_call> <think> </think> #}"
QWEN3_CODER = CHAT_TEMPLATE + "{# <tool_call> <function=x> <parameter=y> #}"


def add(a: int, b: int = 0) -> int:
    """Add two numbers."""
    return a + b


def _task(**kw):
    rows = [{"prompt": [{"role": "user", "content": "2+3?"}], "answer": "5"}]
    return Task("t", rows, rows, Rubric([RewardComponent("one", lambda completions, **k: [1.0] * len(completions))]),
                **kw)


def _play(template, replies, **task_kw):
    tok = tiny_tokenizer()
    tok.chat_template = template
    env = ToolEnv(_task(**task_kw), tok, SampleParams(max_tokens=32), [add], max_turns=3)
    sampler = ScriptedSampler(tok, replies, end_token_id=tok.convert_tokens_to_ids("<|im_end|>"))
    return asyncio.run(env.rollout(env.task.train_rows[0], sampler))


def test_llama3_json_calls_run_under_a_llama_template():
    traj = _play(LLAMA3, ['{"name": "add", "parameters": {"a": 2, "b": 3}}', "5"])
    assert traj.tool_calls == [{"name": "add", "arguments": {"a": 2, "b": 3}}]
    assert traj.metrics["tool_calls"] == 1 and traj.metrics["tool_errors"] == 0 and traj.stop_reason == "answer"


def test_qwen3_coder_xml_calls_typed_by_the_tool_signature():
    reply = ("<tool_call>\n<function=add>\n<parameter=a>\n2\n</parameter>\n<parameter=b>\n3\n</parameter>\n"
             "</function>\n</tool_call>")
    traj = _play(QWEN3_CODER, [reply, "5"])
    assert traj.tool_calls == [{"name": "add", "arguments": {"a": 2, "b": 3}}] and traj.metrics["tool_errors"] == 0
    # the format the env's system prompt asks for still works under that template
    traj = _play(QWEN3_CODER, ['<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>', "1"])
    assert traj.tool_calls == [{"name": "add", "arguments": {"a": 1}}] and traj.metrics["malformed_calls"] == 0


def test_a_call_inside_the_reasoning_is_not_run():
    traj = _play(QWEN3, ['<think><tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call></think>It is 5.'])
    assert traj.tool_calls == [] and traj.stop_reason == "answer"


def test_task_tool_parser_overrides_the_detected_family():
    traj = _play(LLAMA3, ['{"name": "add", "parameters": {"a": 2, "b": 3}}', "5"], tool_parser="hermes")
    assert traj.tool_calls == [] and traj.stop_reason == "answer"


def test_config_keys_reach_the_task():
    from posttrain.tasks.from_config import task_from_config

    task = task_from_config(TaskConfig(name="search-qa", tool_parser="llama3", reasoning_parser="none"))
    assert (task.tool_parser, task.reasoning_parser) == ("llama3", "none")
    assert task_from_config(TaskConfig(name="search-qa")).tool_parser == "auto"  # the task's own
    with pytest.raises(ValueError):
        TaskConfig(tool_parser="gpt")
