"""pydantic-ai (the openai provider), unchanged, against posttrain's server and inside AgentEnv: plain runs, tools and
the turn after a tool result, streaming (`run_stream`), the Responses API (`OpenAIResponsesModel`), structured
output (`NativeOutput`: response_format; the default tool output: a `final_result` call with tool_choice required),
and one training step."""

import asyncio

import pytest

pytest.importorskip("pydantic_ai")

from openai import AsyncOpenAI
from pydantic import BaseModel
from pydantic_ai import Agent, NativeOutput
from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
from pydantic_ai.providers.openai import OpenAIProvider
from scripted_policy import check_one_chain_step, Rule, after_tool, always, offers_tool, tool_call, weather_rules


class Weather(BaseModel):
    city: str
    temp_c: int


WEATHER = {"city": "Paris", "temp_c": 21}


def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny, 21 C in {city}"


def provider(served, rollout_id: str | None = None) -> OpenAIProvider:
    if rollout_id is None:
        return OpenAIProvider(base_url=served.base_url, api_key=served.api_key)
    c = AsyncOpenAI(base_url=served.base_url, api_key=served.api_key, default_headers={"X-Rollout-Id": rollout_id})
    return OpenAIProvider(openai_client=c)


def chat(served, rollout_id: str | None = None) -> OpenAIChatModel:
    return OpenAIChatModel("policy", provider=provider(served, rollout_id))


def responses(served) -> OpenAIResponsesModel:
    return OpenAIResponsesModel("policy", provider=provider(served))


def test_plain_run(served):
    agent = Agent(chat(served), instructions="Be brief.")
    assert agent.run_sync("Say hi.").output == "Hello from the policy."


def test_a_tool_call_and_the_turn_after_its_result_form_one_trained_chain(served):
    agent = Agent(chat(served, "r1"), instructions="Use the tool.", tools=[get_weather])
    result = agent.run_sync("What is the weather in Paris?")
    assert result.output == "It is sunny in Paris."
    kinds = [p.part_kind for m in result.all_messages() for p in m.parts]
    assert kinds == ["user-prompt", "tool-call", "tool-return", "text"], kinds
    assert "sunny, 21 C in Paris" in served.policy.prompts[1]
    record = served.app.state.recorder.pop("r1")
    assert len(record.calls) == 2 and len(record.chains()) == 1


def test_run_stream_with_a_tool(served):
    agent = Agent(chat(served), instructions="Use the tool.", tools=[get_weather])

    async def go():
        async with agent.run_stream("What is the weather in Paris?") as result:
            deltas = [d async for d in result.stream_text(delta=True)]
        return "".join(deltas)

    assert asyncio.run(go()) == "It is sunny in Paris."
    assert len(served.policy.prompts) == 2


@pytest.mark.parametrize("stream", [False, True], ids=["run", "stream"])
def test_responses_model_with_a_tool(served, stream):
    agent = Agent(responses(served), instructions="Use the tool.", tools=[get_weather])

    async def go():
        if not stream:
            return (await agent.run("What is the weather in Paris?")).output
        async with agent.run_stream("What is the weather in Paris?") as result:
            return "".join([d async for d in result.stream_text(delta=True)])

    assert asyncio.run(go()) == "It is sunny in Paris."
    assert "sunny, 21 C in Paris" in served.policy.prompts[1]


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_native_output_is_read_from_a_json_reply(served, api):
    import json

    served.script([Rule(always, json.dumps(WEATHER))])
    agent = Agent(chat(served) if api == "chat" else responses(served), output_type=NativeOutput(Weather))
    assert agent.run_sync("Weather in Paris?").output == Weather(**WEATHER)
    assert served.policy.constraints == [served.policy.constraints[0]] and served.policy.constraints[0] is not None


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_default_tool_output_is_a_final_result_call(served, api):
    """pydantic-ai's default for a model output: a `final_result` tool the model must call (tool_choice
    required), after the agent's own tool."""
    served.script(
        [
            Rule(after_tool, tool_call("final_result", WEATHER)),
            Rule(offers_tool("get_weather"), tool_call("get_weather", {"city": "Paris"})),
        ]
    )
    agent = Agent(chat(served) if api == "chat" else responses(served), output_type=Weather, tools=[get_weather])
    assert agent.run_sync("Weather in Paris?").output == Weather(**WEATHER)
    assert "final_result" in served.policy.prompts[0]
    # tool_choice required: the server forced each call's opening and held its rest to the tools' schemas
    assert all(p.endswith('<tool_call>\n{"name": "') for p in served.policy.prompts), served.policy.prompts[-1][-80:]
    assert all(c is not None for c in served.policy.constraints)


async def weather_agent(client: AsyncOpenAI, row: dict) -> float:
    """The agent as a user writes it; AgentEnv's client is its only link to posttrain."""
    agent = Agent(
        OpenAIChatModel("policy", provider=OpenAIProvider(openai_client=client)),
        instructions="Answer with the weather tool.",
        tools=[get_weather],
    )
    result = await agent.run(row["prompt"])
    return 1.0 if "sunny" in result.output else 0.0


def test_one_agent_env_training_step(train_one_step):
    check_one_chain_step(train_one_step(weather_agent, weather_rules()))
