"""The shared fixtures of tests/agents: the scripted policy answers by the conversation, the served endpoint is
`posttrain serve`'s (key required), and one AgentEnv step with a plain `openai` agent trains on a tool episode."""

import json
from typing import Any

import openai
from scripted_policy import Prompt, Rule, always, mentions, weather_rules

TOOLS: Any = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]


def test_the_script_calls_the_tool_then_answers_with_its_result(served):
    client = openai.OpenAI(base_url=served.base_url, api_key=served.api_key, max_retries=0, timeout=30)
    msgs: Any = [{"role": "user", "content": "Weather in Paris?"}]
    first = client.chat.completions.create(model="policy", messages=msgs, tools=TOOLS)
    (call,) = first.choices[0].message.tool_calls or []
    assert call.type == "function"
    assert first.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    msgs += [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
    ]
    second = client.chat.completions.create(model="policy", messages=msgs, tools=TOOLS)
    assert second.choices[0].message.content == "It is sunny in Paris." and not second.choices[0].message.tool_calls
    plain = client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])
    assert plain.choices[0].message.content == "Hello from the policy."


def test_the_endpoint_wants_the_key_as_posttrain_serve_with_a_key_does(served):
    client = openai.OpenAI(base_url=served.base_url, api_key="wrong", max_retries=0, timeout=30)
    try:
        client.models.list()
    except openai.AuthenticationError:
        pass
    else:
        raise AssertionError("a wrong key was accepted")


def test_rules_read_the_last_message_and_can_be_replaced(served):
    served.script([Rule(mentions("json"), '{"ok": true}'), Rule(always, "no")])
    client = openai.OpenAI(base_url=served.base_url, api_key=served.api_key, max_retries=0, timeout=30)

    def ask(text: str) -> str | None:
        msgs: Any = [{"role": "system", "content": "json"}, {"role": "user", "content": text}]
        return client.chat.completions.create(model="policy", messages=msgs).choices[0].message.content

    assert ask("Answer in JSON.") == '{"ok": true}'
    assert ask("Answer in prose.") == "no"  # "json" in the system message is not the last message
    assert Prompt("<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n").roles == ["user"]


async def openai_tool_agent(client, row):
    """A plain `openai` agent: the tool loop by hand, as the frameworks do it."""
    msgs: Any = [{"role": "user", "content": row["prompt"]}]
    for _ in range(4):
        r = await client.chat.completions.create(model="policy", messages=msgs, tools=TOOLS)
        m = r.choices[0].message
        if not m.tool_calls:
            return 1.0 if "sunny" in (m.content or "") else 0.0
        msgs.append(m.model_dump(exclude_none=True))
        msgs += [{"role": "tool", "tool_call_id": c.id, "content": "sunny, 21 C"} for c in m.tool_calls]
    return 0.0


def test_one_agent_env_step_trains_a_two_turn_tool_episode(train_one_step):
    step = train_one_step(openai_tool_agent, weather_rules())
    m = step.metrics
    assert all(t.reward == 1.0 and len(t.turns) == 2 for t in step.trajectories)
    assert m["agent/calls"] == 2 and m["agent/chains"] == 1 and m["agent/dropped_calls"] == 0
    assert m["weights/changed"] == 1.0
    assert m["train/sampler_logp_abs_diff"] < 1e-3, m["train/sampler_logp_abs_diff"]
