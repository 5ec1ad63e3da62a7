"""Thinking models in AgentEnv (issue 61): the template check runs at start, `thinking: split` trains each context
the server gave the model, as the template renders the agent's history (a new chain where it drops a reply's
reasoning: no trained context keeps reasoning the model will not see), `thinking: keep` serves and trains with a
variant of the template that keeps every turn's reasoning: one chain."""

import asyncio
import copy

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("openai")

from fixtures.templates.thinking_tokenizers import DROPS_TURNS, rewriting_qwen3, thinking_tokenizer

from posttrain.envs.agent import AgentEnv
from posttrain.models.template_check import ChatTemplateError, ThinkingTemplateError
from posttrain.sampling.chat_prompt import ChatRenderer
from posttrain.sampling.scripted import ScriptedSampler
from posttrain.types import sequences_of

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two numbers.",
            "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
        },
    }
]
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
REPLIES = [
    f"<think>\nI should add.\n</think>\n\n{CALL}",
    "<think>\nThe tool says 5.\n</think>\n\n5",
    "<think>\nTwice 5.\n</think>\n\n10",
]


def thinker(sent: list):
    """An agent that sends back each reply as the client got it (reasoning_content included), runs the tool, then
    asks a follow-up question; `sent` gets the messages of each call."""

    async def agent(client, row):
        msgs = [{"role": "system", "content": "Think, then act."}, {"role": "user", "content": "2+3?"}]
        for follow_up in (None, None, "And times 2?"):
            if follow_up:
                msgs.append({"role": "user", "content": follow_up})
            sent.append(copy.deepcopy(msgs))
            r = await client.chat.completions.create(model="policy", messages=msgs, tools=TOOLS, max_tokens=64)
            m = r.choices[0].message
            msgs.append(m.model_dump(exclude_none=True))
            msgs += [{"role": "tool", "tool_call_id": c.id, "content": "5"} for c in m.tool_calls or []]
        return 1.0

    return agent


def _run(env, sampler):
    async def go():
        try:
            return await env.rollout({"prompt": "2+3?"}, sampler)
        finally:
            await env.close()

    return asyncio.run(go())


@pytest.mark.parametrize(
    ("name", "thinking", "chains"),
    [("qwen3", "split", 2), ("qwen3", "keep", 1), ("deepseek_r1", "split", 3), ("deepseek_r1", "keep", 1)],
)
def test_agent_env_trains_each_context_the_thinking_model_saw(name, thinking, chains):
    tok = thinking_tokenizer(name)
    sent: list = []
    env = AgentEnv(thinker(sent), tokenizer=tok, timeout_s=60, thinking=thinking)
    sampler = ScriptedSampler(tok, REPLIES)
    traj = _run(env, sampler)
    assert not traj.failed, traj.error
    assert len(sampler.prompts) == 3
    assert "reasoning_content" in sent[1][2]  # the client kept the reply's reasoning; the template decides
    # Every trained context is a prompt the sampler was given, token for token ...
    all_chains = [traj.turns, *traj.extra_chains]
    assert sorted(t.prompt_ids for ch in all_chains for t in ch) == sorted(sampler.prompts)
    for seq, chain in zip(sequences_of(traj), all_chains, strict=True):
        for t in chain:
            assert (seq.prompt_ids + seq.completion_ids)[: len(t.prompt_ids)] == t.prompt_ids
    # ... and that prompt is the template's rendering of the agent's history (no reasoning the template drops)
    renderer = ChatRenderer(tok) if thinking == "split" else ChatRenderer(tok, env.chat_template(tok), True)
    assert [tok.decode(p) for p in sampler.prompts] == [renderer.text(m, TOOLS, True) for m in sent]
    assert traj.metrics["agent/chains"] == chains
    if thinking == "keep":
        assert "I should add." in tok.decode(traj.turns[-1].prompt_ids)


@pytest.mark.parametrize(
    ("template", "error", "says"),
    [
        (rewriting_qwen3, ThinkingTemplateError, "rewrites more than the reasoning"),
        (lambda: DROPS_TURNS, ChatTemplateError, "not prefix-stable"),
    ],
)
def test_agent_env_runs_the_template_check_at_start(template, error, says):
    tok = copy.copy(thinking_tokenizer("qwen3"))
    tok.chat_template = template()
    with pytest.raises(error, match=says) as e:
        AgentEnv(thinker([]), tokenizer=tok)
    assert e.value.fix
    with pytest.raises(ValueError, match="thinking"):
        AgentEnv(thinker([]), tokenizer=thinking_tokenizer("qwen3"), thinking="drop")
