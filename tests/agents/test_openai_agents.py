"""The OpenAI Agents SDK (`openai-agents`), unchanged, against posttrain's server and inside AgentEnv: plain runs,
tools and the turn after a tool result, streaming (`Runner.run_streamed`), the Responses API (the SDK's default
`OpenAIResponsesModel`), structured output (`output_type=`), and one training step."""

import asyncio

import pytest

pytest.importorskip("agents")

from agents import (
    Agent,
    OpenAIChatCompletionsModel,
    OpenAIProvider,
    OpenAIResponsesModel,
    RunConfig,
    Runner,
    function_tool,
)
from openai import AsyncOpenAI
from pydantic import BaseModel
from scripted_policy import check_one_chain_step, Rule, always, weather_rules


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny, 21 C in {city}"


class Weather(BaseModel):
    city: str
    temp_c: int


WEATHER_JSON = '{"city": "Paris", "temp_c": 21}'


def client(served, rollout_id: str | None = None) -> AsyncOpenAI:
    headers = {"X-Rollout-Id": rollout_id} if rollout_id else None
    return AsyncOpenAI(base_url=served.base_url, api_key=served.api_key, default_headers=headers, max_retries=0)


def chat(c: AsyncOpenAI) -> OpenAIChatCompletionsModel:
    return OpenAIChatCompletionsModel(model="policy", openai_client=c)


def responses(c: AsyncOpenAI) -> OpenAIResponsesModel:
    return OpenAIResponsesModel(model="policy", openai_client=c)


def run(served, go, rollout_id: str | None = None):
    """`go(client)` in a loop of its own, the client closed in that loop (an AsyncOpenAI left to the garbage
    collector would try to close its connections on a later test's loop)."""

    async def main():
        async with client(served, rollout_id) as c:
            return await go(c)

    return asyncio.run(main())


async def streamed(result) -> tuple[str, list[str]]:
    """A streamed run's text deltas, joined, and the names of its run-item events."""
    deltas, names = [], []
    async for event in result.stream_events():
        if event.type == "raw_response_event" and event.data.type == "response.output_text.delta":
            deltas.append(event.data.delta)
        elif event.type == "run_item_stream_event":
            names.append(event.name)
    return "".join(deltas), names


def test_plain_run(served):
    result = run(served, lambda c: Runner.run(Agent(name="greeter", instructions="Be brief.", model=chat(c)), "Hi."))
    assert result.final_output == "Hello from the policy."


def weather(model) -> Agent:
    return Agent(name="weather", instructions="Use the tool.", tools=[get_weather], model=model)


def test_a_tool_call_and_the_turn_after_its_result_form_one_trained_chain(served):
    result = run(served, lambda c: Runner.run(weather(chat(c)), "What is the weather in Paris?"), rollout_id="r1")
    assert result.final_output == "It is sunny in Paris."
    kinds = [item.type for item in result.new_items]
    assert kinds == ["tool_call_item", "tool_call_output_item", "message_output_item"], kinds
    assert "sunny, 21 C in Paris" in served.policy.prompts[1]  # the tool's result reached the second turn
    record = served.app.state.recorder.pop("r1")
    assert len(record.calls) == 2 and len(record.chains()) == 1  # the 2nd call extends the 1st token for token


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_streamed_run_with_a_tool(served, api):
    async def go(c):
        result = Runner.run_streamed(weather(chat(c) if api == "chat" else responses(c)), "Weather in Paris?")
        return result, *(await streamed(result))

    result, text, names = run(served, go)
    assert result.final_output == text == "It is sunny in Paris."
    assert names == ["tool_called", "tool_output", "message_output_created"], names


def test_the_default_responses_model_runs_tools_through_v1_responses(served):
    """No model object: the SDK's default provider (the Responses API), pointed at posttrain by base_url alone."""
    agent = Agent(name="weather", instructions="Use the tool.", tools=[get_weather], model="policy")
    provider = OpenAIProvider(base_url=served.base_url, api_key=served.api_key)
    assert isinstance(provider.get_model("policy"), OpenAIResponsesModel)
    result = Runner.run_sync(agent, "What is the weather in Paris?", run_config=RunConfig(model_provider=provider))
    assert result.final_output == "It is sunny in Paris."
    assert "sunny, 21 C in Paris" in served.policy.prompts[1]


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_structured_output_type(served, api):
    served.script([Rule(always, WEATHER_JSON)])

    async def go(c):
        model = chat(c) if api == "chat" else responses(c)
        agent = Agent(name="weather", instructions="Report the weather.", output_type=Weather, model=model)
        return await Runner.run(agent, "Weather in Paris as JSON.")

    assert run(served, go).final_output == Weather(city="Paris", temp_c=21)
    assert served.policy.constraints[-1] is not None  # the schema reached the sampler as a constraint


async def weather_agent(client: AsyncOpenAI, row: dict) -> float:
    """The agent as a user writes it; AgentEnv's client is its only link to posttrain."""
    agent = Agent(
        name="weather",
        instructions="Answer with the weather tool.",
        tools=[get_weather],
        model=OpenAIChatCompletionsModel(model="policy", openai_client=client),
    )
    result = await Runner.run(agent, row["prompt"])
    return 1.0 if "sunny" in result.final_output else 0.0


async def weather_agent_responses(client: AsyncOpenAI, row: dict) -> float:
    agent = Agent(name="weather", instructions="Answer with the weather tool.", tools=[get_weather])
    result = await Runner.run(
        agent, row["prompt"], run_config=RunConfig(model_provider=OpenAIProvider(openai_client=client))
    )
    return 1.0 if "sunny" in result.final_output else 0.0


@pytest.mark.parametrize("agent_fn", [weather_agent, weather_agent_responses], ids=["chat", "responses"])
def test_one_agent_env_training_step(train_one_step, agent_fn):
    check_one_chain_step(train_one_step(agent_fn, weather_rules()))
