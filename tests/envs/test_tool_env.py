"""ToolEnv: tool schemas, parsing, timeouts, malformed calls, token fidelity and the chat-template check."""

import asyncio
import time

import pytest

from posttrain.envs.task import Task
from posttrain.envs.tool_env import EpisodeEnd, ToolEnv, turn_end_text
from posttrain.envs.tools import Tool, ToolError, call_tool, parse_calls
from posttrain.models.template_check import ChatTemplateError, check_prefix_property
from posttrain.rewards.rubric import RewardComponent, Rubric
from posttrain.sampling.scripted import ScriptedSampler as _Scripted
from posttrain.types import SampleParams
from posttrain.envs.scoring import scored_by


def add(a: int, b: int = 0) -> int:
    """Add two numbers.

    Args:
        a: first number
        b: second number
    """
    return a + b


def slow(x: str) -> str:
    """Sleeps too long."""
    time.sleep(2)
    return x


def ScriptedSampler(tok, replies):  # noqa: N802 - the shared test sampler, ending turns with <|im_end|>
    return _Scripted(tok, replies, end_token_id=tok.convert_tokens_to_ids("<|im_end|>"))


def _task():
    def correct(completions, answer, **kw):
        return [float(c[0]["content"].strip() == a) for c, a in zip(completions, answer)]

    rows = [{"prompt": [{"role": "user", "content": "2+3?"}], "answer": "5"}]
    return Task("t", rows, rows, Rubric([RewardComponent("correct", correct)]))


def test_tool_schema_from_hints_and_docstring():
    s = Tool.from_function(add).schema()["function"]
    assert s["name"] == "add" and s["description"] == "Add two numbers."
    assert s["parameters"]["properties"]["a"] == {"type": "integer", "description": "first number"}
    assert s["parameters"]["required"] == ["a"]


def test_parse_calls_tagged_bare_and_malformed():
    assert parse_calls('x <tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>')[0] == [
        {"name": "add", "arguments": {"a": 1}}]
    assert parse_calls('{"name": "add", "arguments": {"a": 1}}')[0] == [{"name": "add", "arguments": {"a": 1}}]
    calls, errors = parse_calls("<tool_call>{not json</tool_call>")
    assert calls == [] and errors
    assert parse_calls("just an answer") == ([], [])


def test_call_tool_errors_never_raise():
    tools = {"add": Tool.from_function(add), "slow": Tool.from_function(slow)}
    run = lambda call, t=1.0: asyncio.run(call_tool(tools, call, t))  # noqa: E731
    assert run({"name": "add", "arguments": {"a": 2, "b": 3}}).content == "5"
    assert "unknown tool" in run({"name": "mul", "arguments": {}}).content
    assert "missing ['a']" in run({"name": "add", "arguments": {}}).content
    assert "raised TypeError" in run({"name": "add", "arguments": {"a": "x", "b": 1}}).content
    t0 = time.perf_counter()
    r = run({"name": "slow", "arguments": {"x": "y"}}, 0.2)
    assert r.timed_out and not r.ok and time.perf_counter() - t0 < 1.5


def test_episode_runs_tools_and_keeps_token_fidelity(tiny):
    _, tok = tiny
    env = ToolEnv(_task(), tok, SampleParams(max_tokens=32), [add, slow], max_turns=4, tool_timeout_s=0.2)
    sampler = ScriptedSampler(tok, [
        '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>',
        "<tool_call>{broken</tool_call>",
        '<tool_call>{"name": "slow", "arguments": {"x": "1"}}</tool_call>',
        "5",
    ])
    row = env.task.train_rows[0]
    traj = asyncio.run(env.rollout(row, sampler))
    (traj,) = asyncio.run(scored_by(env, [traj]))
    assert len(traj.turns) == 4 and traj.reward == 1.0
    assert traj.metrics["tool_calls"] == 2 and traj.metrics["malformed_calls"] == 1
    assert traj.metrics["tool_timeouts"] == 1 and traj.metrics["tool_errors"] == 1
    # every prompt extends the previous prompt + completion token for token (sequence() checks it)
    tokens, mask, logps = traj.sequence()
    completions = sum(len(t.completion_ids) for t in traj.turns)
    assert sum(mask) == completions and len(mask) == len(tokens) - len(traj.prompt_ids)
    # env tokens (tool results) are in the sequence with mask 0 and logprob 0
    env_positions = [i for i, m in enumerate(mask) if m == 0]
    env_text = tok.decode([tokens[len(traj.prompt_ids) + i] for i in env_positions])
    assert "tool\n5" in env_text and "malformed tool call" in env_text and "timed out" in env_text
    assert all(logps[i] == 0.0 for i in env_positions)
    # the sampler saw exactly these prompts: what the trainer will score
    assert sampler.prompts == [t.prompt_ids for t in traj.turns]
    # and the full conversation rendered by the template tokenizes to the same ids (no drift)
    rendered = tok.apply_chat_template(env.initial_messages(row)[:1] + traj.messages, tokenize=False)
    assert rendered.startswith(tok.decode(tokens))


def test_final_tool_ends_the_episode(tiny):
    _, tok = tiny

    def answer(text: str) -> str:
        """Submit the final answer."""
        return "ok"

    env = ToolEnv(_task(), tok, SampleParams(), [add, answer], final_tool="answer")
    sampler = ScriptedSampler(tok, ['<tool_call>{"name": "answer", "arguments": {"text": "5"}}</tool_call>', "x"])
    traj = asyncio.run(env.rollout(env.task.train_rows[0], sampler))
    (traj,) = asyncio.run(scored_by(env, [traj]))
    assert len(traj.turns) == 1 and traj.completion_text == "5" and traj.reward == 1.0


def test_prefix_check_passes_chatml_and_catches_a_broken_template(tiny):
    _, tok = tiny
    check_prefix_property(tok)
    assert turn_end_text(tok) == "<|im_end|>\n"
    orig = tok.chat_template
    try:
        # drops earlier assistant turns once a later user turn exists (like templates that strip old reasoning)
        tok.chat_template = (
            "{% for message in messages %}{% if message['role'] != 'assistant' or loop.last %}"
            "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
            "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
        with pytest.raises(ChatTemplateError, match=r"not prefix-stable.*token \d+"):
            check_prefix_property(tok)
        with pytest.raises(ChatTemplateError):
            ToolEnv(_task(), tok, SampleParams(), [add])
    finally:
        tok.chat_template = orig


class _Counter:
    """Per-episode state for the hook test: a counter only this episode's `bump` calls move."""

    def __init__(self, row):
        self.n, self.row = 0, row
        self.tools = [self.bump, self.answer]

    def bump(self, by: int = 1) -> str:
        """Add to the counter."""
        if by < 0:
            raise ToolError("by must be >= 0")
        self.n += by
        return str(self.n)

    def answer(self, text: str) -> str:
        """Final answer."""
        return "ok"

    async def finish(self, final_call):
        return EpisodeEnd(metrics={"count": float(self.n)},
                          columns={"count": self.n, "answered": final_call is not None})


def test_per_episode_tools_are_fresh_and_finish_reaches_metrics_and_rubric(tiny):
    _, tok = tiny
    seen = []

    def counted(completions, count, answered, **kw):
        seen.append((list(count), list(answered)))
        return [float(c == 2) for c in count]

    rows = [{"prompt": [{"role": "user", "content": "count"}]}]
    task = Task("t", rows, rows, Rubric([RewardComponent("counted", counted)]))
    made = []
    task.episode = lambda row: made.append(_Counter(row)) or made[-1]
    template = _Counter(None)
    env = ToolEnv(task, tok, SampleParams(), template.tools, final_tool="answer", max_turns=4)
    bump = '<tool_call>{"name": "bump", "arguments": {"by": 1}}</tool_call>'
    bad = '<tool_call>{"name": "bump", "arguments": {"by": -1}}</tool_call>'
    answer = '<tool_call>{"name": "answer", "arguments": {"text": "done"}}</tool_call>'

    async def both():  # two episodes at once: each bumps its own counter
        return await asyncio.gather(env.rollout(rows[0], ScriptedSampler(tok, [bump, bad, bump, answer])),
                                    env.rollout(rows[0], ScriptedSampler(tok, [bump, answer])))

    a, b = asyncio.run(both())
    a, b = asyncio.run(scored_by(env, [a, b]))
    assert len(made) == 2 and template.n == 0 and sorted(e.n for e in made) == [1, 2]
    assert a.metrics["count"] == 2 and b.metrics["count"] == 1 and a.metrics["tool_errors"] == 1
    assert seen == [([2, 1], [True, True])] and a.reward == 1.0 and b.reward == 0.0
    tool_msgs = [m["content"] for m in a.messages if m["role"] == "tool"]
    assert tool_msgs[1] == "error: bump: by must be >= 0"  # a ToolError reads without an exception type


def test_episode_tools_must_match_the_prompted_ones(tiny):
    _, tok = tiny

    class Odd(_Counter):
        def __init__(self, row):
            super().__init__(row)
            self.tools = [self.bump]

    env = ToolEnv(_task(), tok, SampleParams(), [add], episode_factory=Odd)
    with pytest.raises(ValueError, match="differ"):
        asyncio.run(env.rollout(env.task.train_rows[0], ScriptedSampler(tok, ["x"])))


def test_hung_sync_tools_are_bounded(monkeypatch):
    """Cancelled work must end or be bounded (issue #42): a sync tool that hangs past its timeout cannot be
    killed (a Python thread), so each one is abandoned; past MAX_HUNG_TOOL_THREADS still running, new sync calls
    are refused instead of piling up threads."""
    import threading

    from posttrain.envs import tools as tools_mod

    before = tools_mod.hung_tool_threads()  # an earlier test's abandoned tool may still be running
    monkeypatch.setattr(tools_mod, "MAX_HUNG_TOOL_THREADS", before + 3)
    release = threading.Event()
    started: list[int] = []

    def stuck(x: int) -> str:
        """Hangs until released."""
        started.append(x)
        release.wait(30)
        return "late"

    tools = {"stuck": Tool.from_function(stuck)}

    async def main() -> list:
        return [await call_tool(tools, {"name": "stuck", "arguments": {"x": i}}, 0.05) for i in range(6)]

    try:
        results = asyncio.run(main())
        assert all(r.timed_out and not r.ok for r in results)
        assert len(started) == 3, "only MAX_HUNG_TOOL_THREADS hung calls may run at once"
        assert "still running past their timeout" in results[-1].content
    finally:
        release.set()
    deadline = time.monotonic() + 10
    while tools_mod.hung_tool_threads() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert tools_mod.hung_tool_threads() <= before  # once they end, calls run again
