"""mini-swe-agent, unchanged, against posttrain: its `LitellmModel(model_name="openai/policy", model_kwargs={"api_base":
<posttrain>/v1, "api_key": ...})` is the one line that points it at the policy, with its own `DefaultAgent`, its
default config (default.yaml) and its `LocalEnvironment` in a tmp dir (no docker, no network). Plain calls, its bash
tool over two tool turns, streaming through litellm with the same model settings, and AgentEnv training steps with
the sync agent run as it is written.

mini-swe-agent leaves a reply without a command out of its history (a format error message takes its place), so the
next call does not extend it: AgentEnv trains that call as a sequence of its own, none dropped.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

# Before litellm and minisweagent are imported: litellm's model-cost map from the package (not fetched), no startup
# banner, mini-swe-agent's global config in the session's tmp home (tests/hermetic.py), one try per model call.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
os.environ.setdefault("MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT", "1")

pytest.importorskip("minisweagent")
litellm = pytest.importorskip("litellm")
yaml = pytest.importorskip("yaml")

from minisweagent import package_dir  # noqa: E402
from minisweagent.agents.default import DefaultAgent  # noqa: E402
from minisweagent.environments.local import LocalEnvironment  # noqa: E402
from minisweagent.models.litellm_model import LitellmModel  # noqa: E402
from scripted_policy import Prompt, Rule, after_tool, always, mentions, tool_call  # noqa: E402

from posttrain.loop.batch import sequences_from_groups  # noqa: E402
from posttrain.types import Group  # noqa: E402

AGENT_CONFIG = yaml.safe_load(Path(package_dir / "config" / "default.yaml").read_text())["agent"]
TASK = "Write 1 + 2 to answer.txt, then submit it."
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && cat answer.txt"


def tool_results(p: Prompt) -> int:
    return p.roles.count("tool")


def bash_rules(format_error: bool = False) -> list[Rule]:
    """Write the answer with one bash call, then submit it with a second (it reads the first one's file). With
    `format_error`, the first reply has no command: mini-swe-agent answers with a format error and drops the reply."""
    first = tool_call("bash", {"command": "echo $((1 + 2)) > answer.txt"})
    return [
        Rule(lambda p: after_tool(p) and tool_results(p) >= 1, tool_call("bash", {"command": SUBMIT})),
        Rule(mentions("No tool calls found"), first),  # its format error message
        Rule(mentions("Please solve this issue"), "Let me think about it first." if format_error else first),
        Rule(always, "Hello from the policy."),
    ]


def model_for(base_url: str, api_key: str, **model_kwargs) -> LitellmModel:
    return LitellmModel(
        model_name="openai/policy",
        model_kwargs={"api_base": base_url, "api_key": api_key, "timeout": 60, **model_kwargs},
        cost_tracking="ignore_errors",  # a local model has no price
    )


def run_agent(model: LitellmModel, cwd: str) -> tuple[DefaultAgent, dict]:
    agent = DefaultAgent(model, LocalEnvironment(cwd=cwd, timeout=10), **{**AGENT_CONFIG, "step_limit": 6})
    return agent, agent.run(TASK)


def test_a_plain_call(served):
    """LitellmModel.query wants a command in every reply; a plain call is litellm's, with the model's settings."""
    model = model_for(served.base_url, served.api_key)
    r = litellm.completion(
        model=model.config.model_name, messages=[{"role": "user", "content": "hi"}], **model.config.model_kwargs
    )
    assert r.choices[0].message.content == "Hello from the policy."


def test_the_bash_tool_over_two_tool_turns(served, tmp_path):
    served.script(bash_rules())
    agent, result = run_agent(model_for(served.base_url, served.api_key), str(tmp_path))
    assert result["exit_status"] == "Submitted" and result["submission"].strip() == "3"
    assert (tmp_path / "answer.txt").read_text().strip() == "3"
    assert agent.n_calls == 2
    assert [m["role"] for m in agent.messages] == ["system", "user", "assistant", "tool", "assistant", "exit"]


def test_a_reply_without_a_command_is_a_format_error_and_the_agent_goes_on(served, tmp_path):
    served.script(bash_rules(format_error=True))
    agent, result = run_agent(model_for(served.base_url, served.api_key), str(tmp_path))
    assert result["exit_status"] == "Submitted" and result["submission"].strip() == "3"
    assert agent.n_calls == 3
    # The reply without a command is not in the history: the format error message took its place.
    roles = [m["role"] for m in agent.messages]
    assert roles == ["system", "user", "user", "assistant", "tool", "assistant", "exit"]
    assert "No tool calls found" in agent.messages[2]["content"]


def test_streaming_through_litellm_with_the_same_model_settings(served):
    """mini-swe-agent's model does not stream; litellm, with the same model name and settings, does."""
    served.script(bash_rules())
    model = model_for(served.base_url, served.api_key)
    messages = [{"role": "user", "content": "Please solve this issue: " + TASK}]
    tools = [
        {
            "type": "function",
            "function": {
                "name": "bash",
                "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
            },
        }
    ]
    chunks = list(
        litellm.completion(
            model=model.config.model_name, messages=messages, tools=tools, stream=True, **model.config.model_kwargs
        )
    )
    assert len(chunks) > 1
    whole = litellm.stream_chunk_builder(chunks, messages=messages)
    (call,) = whole.choices[0].message.tool_calls
    assert call.function.name == "bash" and "answer.txt" in call.function.arguments
    plain = litellm.completion(
        model=model.config.model_name,
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        **model.config.model_kwargs,
    )
    assert "".join(c.choices[0].delta.content or "" for c in plain) == "Hello from the policy."


def test_litellm_responses_api_with_the_same_model_settings(served):
    """litellm's Responses client (`litellm.responses`), with mini-swe-agent's model name and settings: a tool call
    over /v1/responses, then the turn after its result, and a streamed reply."""
    served.script(bash_rules())
    model = model_for(served.base_url, served.api_key)
    tools = [{"type": "function", "name": "bash",
              "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}]
    first = litellm.responses(
        model=model.config.model_name, input="Please solve this issue: " + TASK, tools=tools, **model.config.model_kwargs
    )
    (call,) = [o for o in first.output if o.type == "function_call"]
    assert call.name == "bash" and "answer.txt" in call.arguments
    second = litellm.responses(
        model=model.config.model_name,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": ""}],
        previous_response_id=first.id,
        tools=tools,
        **model.config.model_kwargs,
    )
    (again,) = [o for o in second.output if o.type == "function_call"]
    assert "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT" in again.arguments  # the rule for after a tool result
    events = list(litellm.responses(model=model.config.model_name, input="hi", stream=True, **model.config.model_kwargs))
    done = [e for e in events if getattr(e, "type", "") == "response.completed"]
    assert done and "Hello from the policy." in str(done[-1])


def mini_swe_agent(client, row):
    """The mini-swe-agent run a user writes, run by AgentEnv as it is (a plain function: AgentEnv runs it in a thread
    with a blocking client). Only the model's base_url, key and rollout-id header point it at posttrain."""
    model = LitellmModel(
        model_name="openai/policy",
        model_kwargs={
            "api_base": str(client.base_url),
            "api_key": client.api_key,
            "timeout": 60,
        },
        cost_tracking="ignore_errors",
    )
    with tempfile.TemporaryDirectory() as cwd:
        agent = DefaultAgent(model, LocalEnvironment(cwd=cwd, timeout=10), **{**AGENT_CONFIG, "step_limit": 6})
        result = agent.run(row["prompt"])
    return 1.0 if result.get("submission", "").strip() == "3" else 0.0


def test_an_agentenv_training_step_with_the_sync_agent(train_one_step):
    """A blocking mini-swe-agent inside AgentEnv: it runs to its submission (no timeout), its bash tool episode of
    two calls is one chain, and the step updates the model."""
    r = train_one_step(mini_swe_agent, bash_rules(), rows=[{"prompt": TASK}], group=2)
    assert [t.reward for t in r.trajectories] == [1.0, 1.0]
    assert r.stats["timeouts"] == 0 and r.stats["failed"] == 0
    assert r.metrics["agent/calls"] == 2 and r.metrics["agent/chains"] == 1
    assert r.metrics["weights/changed"] == 1.0
    assert r.metrics["train/sampler_logp_abs_diff"] < 0.01


def test_a_format_error_episode_trains_every_call_and_drops_none(train_one_step):
    """The reply without a command is left out of mini-swe-agent's history, so the next call does not extend it:
    2 chains an episode (the lone reply; the rest), both trained, nothing dropped."""
    r = train_one_step(mini_swe_agent, bash_rules(format_error=True), rows=[{"prompt": TASK}], group=2)
    assert [t.reward for t in r.trajectories] == [1.0, 1.0]
    assert r.metrics["agent/calls"] == 3 and r.metrics["agent/chains"] == 2
    assert r.metrics["agent/dropped_calls"] == 0 and r.stats["dropped_calls"] == 0
    assert r.metrics["batch/sequences"] == 4
    seqs = sequences_from_groups([Group(0, r.trajectories)])
    sampled = sum(len(t.completion_ids) for traj in r.trajectories for t in traj.turns)
    sampled += sum(len(t.completion_ids) for traj in r.trajectories for ch in traj.extra_chains for t in ch)
    assert sum(sum(s.loss_mask) for s in seqs) == sampled > 0  # every sampled token is in a training sequence


def test_a_real_policy_at_the_default_sampling_settings_trains_on_policy():
    """mini-swe-agent sets no temperature: its calls are sampled at the run's (SamplingConfig's default), the one the
    trainer scores at, so the recorded log-probs are the trainer's. tiny-random writes no command: every reply is a
    format error, and mini-swe-agent stops after three in a row."""
    from real_policy import default_config_step

    m = default_config_step(mini_swe_agent, [{"prompt": TASK}], group=2)
    assert m["timeouts"] == 0 and m["agent/calls"] == 6  # 3 a run, each a format error
    assert m["agent/temperature_overrides"] == 0 and m["agent/dropped_calls"] == 0
    print(f"\nsampler_logp_abs_diff {m['train/sampler_logp_abs_diff']:.2e}")  # docs/results/agents.md
    assert m["train/sampler_logp_abs_diff"] < 0.01, m["train/sampler_logp_abs_diff"]
