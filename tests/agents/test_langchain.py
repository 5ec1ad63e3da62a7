"""langchain-openai's ChatOpenAI and a LangGraph agent, unchanged, against posttrain's server and inside AgentEnv:
plain calls, tools and the turn after a tool result, streaming (`.stream()`, LangGraph `stream_mode="messages"`),
the Responses API (`use_responses_api=True`), structured output (`with_structured_output`: its default json_schema
and method="function_calling"), and one training step (async and sync agents)."""

import asyncio
import json

import pytest

pytest.importorskip("langchain_openai")
pytest.importorskip("langgraph")

from langchain_core.messages import AIMessageChunk, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.prebuilt import create_react_agent
from pydantic import BaseModel
from scripted_policy import check_one_chain_step, Rule, always, tool_call, weather_rules

# langgraph 1.x points create_react_agent's users at `langchain.agents.create_agent` (the `langchain` package, not
# installed here); the prebuilt agent is what most LangGraph code in the wild still uses.
pytestmark = pytest.mark.filterwarnings("ignore::langgraph.warnings.LangGraphDeprecatedSinceV10")


@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny, 21 C in {city}"


class Weather(BaseModel):
    city: str
    temp_c: int


WEATHER = {"city": "Paris", "temp_c": 21}
ASK = "What is the weather in Paris?"


def llm(served, **kw) -> ChatOpenAI:
    return ChatOpenAI(model="policy", base_url=served.base_url, api_key=served.api_key, max_retries=0, **kw)


def test_plain_invoke(served):
    assert llm(served).invoke("Say hi.").content == "Hello from the policy."


@pytest.mark.parametrize("responses", [False, True], ids=["chat", "responses"])
def test_bound_tools_call_and_the_turn_after_the_result(served, responses):
    model = llm(served, use_responses_api=responses).bind_tools([get_weather])
    msgs = [HumanMessage(ASK)]
    first = model.invoke(msgs)
    (call,) = first.tool_calls
    assert call["name"] == "get_weather" and call["args"] == {"city": "Paris"}
    msgs += [first, ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"])]
    second = model.invoke(msgs)
    assert second.text == "It is sunny in Paris." and not second.tool_calls
    assert "sunny, 21 C in Paris" in served.policy.prompts[1]


def test_a_langgraph_agent_s_two_calls_form_one_trained_chain(served):
    agent = create_react_agent(llm(served, default_headers={"X-Rollout-Id": "r1"}), [get_weather])
    out = agent.invoke({"messages": [("user", ASK)]})
    assert [m.type for m in out["messages"]] == ["human", "ai", "tool", "ai"]
    assert out["messages"][-1].content == "It is sunny in Paris."
    record = served.app.state.recorder.pop("r1")
    assert len(record.calls) == 2 and len(record.chains()) == 1


@pytest.mark.parametrize("responses", [False, True], ids=["chat", "responses"])
def test_stream(served, responses):
    chunks = list(llm(served, use_responses_api=responses).stream("Say hi."))
    assert len(chunks) > 1 and all(isinstance(c, AIMessageChunk) for c in chunks)
    assert "".join(c.text for c in chunks) == "Hello from the policy."


def test_langgraph_stream_mode_messages_with_a_tool(served):
    agent = create_react_agent(llm(served), [get_weather])

    async def go():
        seen = []
        async for msg, meta in agent.astream({"messages": [("user", ASK)]}, stream_mode="messages"):
            seen.append((meta["langgraph_node"], msg))  # pyright: ignore[reportArgumentType] - a (message, metadata dict) pair in this stream mode
        return seen

    seen = asyncio.run(go())
    said = "".join(m.text for node, m in seen if node == "agent" and isinstance(m, AIMessageChunk))
    calls = [c for node, m in seen if isinstance(m, AIMessageChunk) for c in m.tool_call_chunks]
    tools = [m.content for node, m in seen if node == "tools"]
    assert said == "It is sunny in Paris."
    assert calls and json.loads("".join(c["args"] or "" for c in calls)) == {"city": "Paris"}
    assert tools == ["sunny, 21 C in Paris"]


@pytest.mark.parametrize("responses", [False, True], ids=["chat", "responses"])
def test_with_structured_output_default_json_schema(served, responses):
    served.script([Rule(always, json.dumps(WEATHER))])
    out = llm(served, use_responses_api=responses).with_structured_output(Weather).invoke("Weather in Paris?")
    assert out == Weather(**WEATHER)
    assert served.policy.constraints[-1] is not None  # response_format reached the sampler as a constraint


def test_with_structured_output_function_calling(served):
    served.script([Rule(always, tool_call("Weather", WEATHER))])
    model = llm(served).with_structured_output(Weather, method="function_calling")
    assert model.invoke("Weather in Paris?") == Weather(**WEATHER)
    # a named tool_choice: the server forced the call's opening with the name, the script wrote the rest
    assert served.policy.prompts[-1].endswith('<tool_call>\n{"name": "Weather", "arguments": ')


async def weather_agent(client, row: dict) -> float:
    """The LangGraph agent as a user writes it, pointed at AgentEnv's endpoint (its base_url, key and the
    episode's rollout-id header)."""
    model = ChatOpenAI(
        model="policy", base_url=str(client.base_url), api_key=client.api_key
    )
    agent = create_react_agent(model, [get_weather])
    out = await agent.ainvoke({"messages": [("user", row["prompt"])]})
    return 1.0 if "sunny" in out["messages"][-1].content else 0.0


def weather_agent_sync(client, row: dict) -> float:
    """The same agent with langchain's blocking `.invoke` (AgentEnv runs a plain function in a thread)."""
    model = ChatOpenAI(
        model="policy", base_url=str(client.base_url), api_key=client.api_key
    )
    out = create_react_agent(model, [get_weather]).invoke({"messages": [("user", row["prompt"])]})
    return 1.0 if "sunny" in out["messages"][-1].content else 0.0


@pytest.mark.parametrize("agent_fn", [weather_agent, weather_agent_sync], ids=["async", "sync"])
def test_one_agent_env_training_step(train_one_step, agent_fn):
    check_one_chain_step(train_one_step(agent_fn, weather_rules()))
