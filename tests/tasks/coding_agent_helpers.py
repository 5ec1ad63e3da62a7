"""Shared pieces of the coding-agent tests: a tiny in-memory repo, calling a tool the way ToolEnv does, and
scripted episodes on the tiny model's tokenizer."""

from __future__ import annotations

import asyncio

import pytest

from posttrain.tasks.coding_agent.episode import RepoEpisode
from posttrain.envs.tool_env import ToolEnv
from posttrain.envs.tools import Tool, call_tool
from posttrain.sampling.scripted import ScriptedSampler as _Scripted
from posttrain.types import SampleParams
from posttrain.envs.scoring import scored_by

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


def small_episode() -> RepoEpisode:
    """An episode on SOURCES/TESTS without a grader (run_tests refuses): the tools alone."""
    return RepoEpisode(SOURCES, TESTS, grade=None)


def run_tool(ep: RepoEpisode, name: str, **args):
    """One call the way ToolEnv makes it: through call_tool, so errors come back as results."""
    tools = {t.name: t for t in map(Tool.from_function, ep.tools)}
    return asyncio.run(call_tool(tools, {"name": name, "arguments": args}, 10.0))


def ScriptedSampler(tok, replies):  # noqa: N802 - ends each turn as the model would (after the stop string)
    return _Scripted(tok, replies, end_token_id=tok.convert_tokens_to_ids("<|im_end|>"), stop_ends_reply=True)


def tool_env(task, tok) -> ToolEnv:
    return ToolEnv(task, tok, SampleParams(max_tokens=task.max_tokens, stop=task.stop), task.tools,
                   max_turns=task.max_turns, final_tool=task.final_tool, tool_timeout_s=task.tool_timeout_s)


def play(task, tok, row, replies):
    """One scripted episode through ToolEnv, scored."""
    env = tool_env(task, tok)
    traj = asyncio.run(env.rollout(row, ScriptedSampler(tok, replies)))
    (traj,) = asyncio.run(scored_by(env, [traj]))
    return traj
