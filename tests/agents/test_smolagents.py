"""smolagents, unchanged, against posttrain: `OpenAIServerModel(model_id="policy", api_base=<posttrain>/v1,
api_key=...)` is the one line that points it at the policy. Plain calls, ToolCallingAgent's tool turns (smolagents sends
`tool_choice: "required"` on every action call), streaming (`stream_outputs=True`), CodeAgent's structured output
(`response_format` json_schema) and AgentEnv training steps, with the sync agent run as it is written.

smolagents rebuilds its history for its planning and final-answer calls (a fresh system prompt, the memory as text),
so its calls do not extend one another: AgentEnv trains each chain of calls as a sequence of its own, none dropped.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

smolagents = pytest.importorskip("smolagents")

from scripted_policy import Prompt, Rule, always, has_tools, tool_call  # noqa: E402
from smolagents import CodeAgent, OpenAIServerModel, ToolCallingAgent, tool  # noqa: E402

from posttrain.loop.batch import sequences_from_groups  # noqa: E402
from posttrain.types import Group  # noqa: E402

TASK = "What is 1 + 2 + 4?"


@tool
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first integer
        b: the second integer
    """
    return a + b


def observations(p: Prompt) -> int:
    """How many tool results smolagents has written into this prompt (it sends them as user text)."""
    return p.text.count("Observation:\n")


def is_plan(p: Prompt) -> bool:
    """A planning call: smolagents' planning prompts offer no tools and ask for a plan ending in <end_plan>."""
    return not has_tools(p) and "<end_plan>" in p.text


def adder_rules(final: str = "final_answer") -> list[Rule]:
    """1 + 2 with `add`, then + 4 with `add` (the second tool turn reads the first result), then `final` (the
    final_answer tool, or another add so the run reaches max_steps and smolagents summarises a final answer)."""
    last = tool_call("final_answer", {"answer": "7"}) if final == "final_answer" else tool_call("add", {"a": 7, "b": 0})
    return [
        Rule(is_plan, "1. add 1 and 2\n2. add 4\n<end_plan>"),
        Rule(lambda p: has_tools(p) and observations(p) == 0, tool_call("add", {"a": 1, "b": 2})),
        Rule(
            lambda p: has_tools(p) and observations(p) == 1 and "Observation:\n3" in p.text,
            tool_call("add", {"a": 3, "b": 4}),
        ),
        Rule(lambda p: has_tools(p) and "Observation:\n7" in p.text, last),
        Rule(always, "7"),  # smolagents' final-answer summary after max_steps
    ]


class Requests:
    """The JSON bodies a smolagents model sent (an httpx request hook on its own client: what left the framework)."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    def __call__(self, request: httpx.Request) -> None:
        if request.url.path.endswith("/chat/completions"):
            self.bodies.append(json.loads(request.read()))


def model_for(served, **client_kwargs) -> OpenAIServerModel:
    return OpenAIServerModel(
        model_id="policy", api_base=served.base_url, api_key=served.api_key, client_kwargs=client_kwargs or None
    )


def calls_made(agent) -> list[tuple[str, dict]]:
    return [(c.name, c.arguments) for s in agent.memory.steps for c in (getattr(s, "tool_calls", None) or [])]


def test_a_plain_call(served):
    msg = model_for(served).generate([{"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    assert msg.content == "Hello from the policy."
    assert msg.token_usage is not None and msg.token_usage.output_tokens > 0


@pytest.mark.parametrize("stream", [False, True], ids=["blocking", "stream_outputs"])
def test_tool_calls_over_two_tool_turns_with_tool_choice_required(served, stream):
    served.script(adder_rules())
    seen = Requests()
    model = model_for(served, http_client=httpx.Client(event_hooks={"request": [seen]}, timeout=30))
    agent = ToolCallingAgent(tools=[add], model=model, max_steps=4, verbosity_level=0, stream_outputs=stream)
    assert agent.run(TASK) == "7"
    assert calls_made(agent) == [
        ("add", {"a": 1, "b": 2}),
        ("add", {"a": 3, "b": 4}),
        ("final_answer", {"answer": "7"}),
    ]
    assert len(seen.bodies) == 3
    # ToolCallingAgent asks for a tool call on every action call: the server takes it (the policy decides).
    assert all(b["tool_choice"] == "required" and b["tools"] for b in seen.bodies)
    assert all(b.get("stream", False) is stream for b in seen.bodies)
    if stream:
        assert all(b["stream_options"] == {"include_usage": True} for b in seen.bodies)


def test_code_agent_structured_output(served):
    """CodeAgent(use_structured_outputs_internally=True) asks for a json_schema reply {thought, code}. The server
    accepts the request (it does not constrain decoding to the schema); a policy reply that follows it runs."""
    served.script([Rule(always, json.dumps({"thought": "add them", "code": "final_answer(add(add(1, 2), 4))"}))])
    seen = Requests()
    model = model_for(served, http_client=httpx.Client(event_hooks={"request": [seen]}, timeout=30))
    agent = CodeAgent(tools=[add], model=model, max_steps=2, verbosity_level=0, use_structured_outputs_internally=True)
    assert agent.run(TASK) == 7
    (body,) = seen.bodies
    assert body["response_format"]["type"] == "json_schema"
    assert body["response_format"]["json_schema"]["name"] == "ThoughtAndCodeAnswer"


def smol_agent(client, row):
    """The smolagents agent a user writes, run by AgentEnv as it is (a plain function: AgentEnv runs it in a thread
    with a blocking client). Only the model's base_url, key and rollout-id header point it at posttrain."""
    model = OpenAIServerModel(
        model_id="policy",
        api_base=str(client.base_url),
        api_key=client.api_key,
        client_kwargs={"max_retries": 0, "timeout": 60},
    )
    agent = ToolCallingAgent(
        tools=[add],
        model=model,
        max_steps=row.get("max_steps", 4),
        planning_interval=row.get("plan"),
        verbosity_level=0,
    )
    return 1.0 if str(agent.run(row["prompt"])).strip() == "7" else 0.0


def trained_tokens(result) -> tuple[int, int]:
    """(loss-masked tokens of the step's sequences, tokens the policy sampled): equal when every call is trained."""
    seqs = sequences_from_groups([Group(0, result.trajectories)])
    sampled = sum(len(t.completion_ids) for traj in result.trajectories for t in traj.turns)
    sampled += sum(len(t.completion_ids) for traj in result.trajectories for ch in traj.extra_chains for t in ch)
    return sum(sum(s.loss_mask) for s in seqs), sampled


def test_an_agentenv_training_step_with_the_sync_agent(train_one_step):
    """A blocking smolagents agent inside AgentEnv: it runs to its answer (no timeout), the step updates the model."""
    r = train_one_step(smol_agent, adder_rules(), rows=[{"prompt": TASK}], group=2)
    assert [t.reward for t in r.trajectories] == [1.0, 1.0]
    assert r.stats["timeouts"] == 0 and r.stats["failed"] == 0
    assert r.metrics["agent/calls"] == 3 and r.metrics["weights/changed"] == 1.0
    assert r.metrics["train/sampler_logp_abs_diff"] < 0.01


def test_planning_every_step_trains_all_five_calls_and_drops_none(train_one_step):
    """planning_interval=1, max_steps=2: plan, act, re-plan (from a summary), act, final answer (from the memory as
    text): 5 calls, none extending another. chains="all" (the default): 5 sequences an episode, nothing dropped."""
    rows = [{"prompt": TASK, "plan": 1, "max_steps": 2}]
    r = train_one_step(smol_agent, adder_rules(final="add"), rows=rows, group=2)
    assert r.metrics["agent/calls"] == 5
    assert r.metrics["agent/dropped_calls"] == 0 and r.stats["dropped_calls"] == 0
    assert r.metrics["agent/chains"] == 5
    assert r.metrics["batch/sequences"] == 10
    masked, sampled = trained_tokens(r)
    assert masked == sampled > 0  # every sampled token of every call is in a training sequence
    assert [t.reward for t in r.trajectories] == [1.0, 1.0]  # the summarised final answer is "7"


def smol_code_agent(client, row):
    """A CodeAgent (plain text replies: no tool_choice, no response_format, no temperature set)."""
    model = OpenAIServerModel(
        model_id="policy",
        api_base=str(client.base_url),
        api_key=client.api_key,
        client_kwargs={"max_retries": 0, "timeout": 60},
    )
    agent = CodeAgent(tools=[add], model=model, max_steps=1, verbosity_level=0)
    return 1.0 if str(agent.run(row["prompt"])).strip() == "7" else 0.0


def test_a_real_policy_at_the_default_sampling_settings_trains_on_policy():
    """smolagents sets no temperature: its calls are sampled at the run's (SamplingConfig's default), the one the
    trainer scores at, so the recorded log-probs are the trainer's (tiny-random writes no code: one action call,
    then smolagents' final-answer call, a run)."""
    from real_policy import default_config_step

    m = default_config_step(smol_code_agent, [{"prompt": TASK}], group=2)
    assert m["timeouts"] == 0 and m["agent/calls"] == 4
    assert m["agent/temperature_overrides"] == 0 and m["agent/dropped_calls"] == 0
    print(f"\nsampler_logp_abs_diff {m['train/sampler_logp_abs_diff']:.2e}")  # docs/results/agents.md
    assert m["train/sampler_logp_abs_diff"] < 0.01, m["train/sampler_logp_abs_diff"]
