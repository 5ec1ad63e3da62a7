"""A tool-use task in 30 lines: the policy may call a calculator before answering.

    posttrain train task.name=examples/tool_task.py:make_task warm_start.steps=20 loop.steps=10

The warm start is part of the command on purpose: the untrained 135M model never writes a working tool call,
so without it every reward is 0 and RL has nothing to reinforce (`posttrain env check --preflight` says so).

Tools are plain functions: their type hints and docstrings become the JSON schemas shown to the model. With
`tools` in the task, the loop runs a multi-turn ToolEnv: the policy writes
<tool_call>{"name": "multiply", "arguments": {"a": 12, "b": 34}}</tool_call>, the result comes back as a tool
message (loss mask 0), and the episode ends when it replies without a tool call or after `max_turns` replies.
Reward functions see the final reply plus `tool_calls` (every call of the episode) and `num_turns`.

`demonstrate` shows the policy how it is done (call the tool, then state the result); `warm_start.steps=20`
runs a short supervised warm start on those demonstrations before RL.
"""

import json
import random
import re


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: first factor
        b: second factor
    """
    return a * b


def correct(completions, answer, **kwargs):
    texts = [c[0]["content"] for c in completions]
    return [1.0 if (m := re.findall(r"-?\d+", t)) and int(m[-1]) == a else 0.0 for t, a in zip(texts, answer)]


def fewer_calls(completions, tool_calls, **kwargs):
    return [-0.05 * len(calls) for calls in tool_calls]


def demonstrate(row):
    """The replies of a policy that uses the tool: one call, then the answer."""
    call = {"name": "multiply", "arguments": {"a": row["a"], "b": row["b"]}}
    return [f"<tool_call>{json.dumps(call)}</tool_call>", f"{row['a']} * {row['b']} = {row['answer']}"]


def make_task(n: int = 200, seed: int = 0):
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(11, 99), rng.randint(11, 99)
        rows.append({"prompt": [{"role": "user", "content": f"What is {a} * {b}? End with the number."}],
                     "a": a, "b": b, "answer": a * b})
    return {"train": rows[:-40], "eval": rows[-40:], "rewards": [correct, fewer_calls], "tools": [multiply],
            "max_turns": 3, "max_tokens": 48, "demonstrate": demonstrate}
