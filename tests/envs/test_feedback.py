"""Feedback in words (envs/feedback.py, Task.feedback): asked only about samples that did not pass, never fatal,
stored on the trajectory and in samples.jsonl; ToolEnv names the turn of the first failed call; the built-in
JSON feedback says what is wrong."""

import asyncio
import json
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.envs.base import score_groups
from posttrain.envs.feedback import MAX_FEEDBACK_CHARS, attach_feedback
from posttrain.envs.single_turn import SingleTurnEnv
from posttrain.envs.task import Task
from posttrain.envs.tool_env import ToolEnv
from posttrain.obs.rollout_stats import rollout_metrics, sample_records
from posttrain.rewards.json_rewards import json_feedback
from posttrain.rewards.rubric import RewardComponent, Rubric
from posttrain.sampling.scripted import ScriptedSampler
from posttrain.types import SampleParams, Trajectory, Turn


def _exact(completions, answer, **kw):
    return [float(c == a) for c, a in zip(completions, answer)]


def _task(feedback):
    rows = [{"prompt": "2+3=", "answer": "5"}]
    return Task("t", rows, rows, Rubric([RewardComponent("exact", _exact)]), feedback=feedback)


def _traj(text, row):
    return Trajectory(turns=[Turn([1, 2], [3], [-0.1], 0)], completion_text=text, row=row)


def _scored(task, texts):
    env = SingleTurnEnv(task, tokenizer=None, params=SampleParams())
    trajs = [_traj(t, task.train_rows[0]) for t in texts]
    (scored,) = asyncio.run(score_groups(env, [trajs]))
    return scored


def test_feedback_is_asked_only_about_samples_that_did_not_pass():
    asked = []

    def feedback(completions, answer, **kw):
        asked.extend(completions)
        return [f"the answer is {a}, not {c}" for c, a in zip(completions, answer)]

    right, wrong = _scored(_task(feedback), ["5", "6"])
    assert asked == ["6"]
    assert right.feedback is None and wrong.feedback == "the answer is 5, not 6"
    rec = sample_records([right, wrong], 2)
    assert "feedback" not in rec[0] and rec[1]["feedback"] == "the answer is 5, not 6"


def test_a_failing_or_slow_feedback_function_never_fails_a_sample():
    def broken(completions, **kw):
        raise RuntimeError("boom")

    (t,) = _scored(_task(broken), ["6"])
    assert not t.failed and t.feedback is None and t.reward == 0.0
    (asked,) = attach_feedback(_task(broken), [_traj("6", {"prompt": "x", "answer": "5"})])
    assert asked.metrics == {"feedback/failed": 1.0} and asked.feedback is None
    right, wrong = _scored(_task(broken), ["5", "6"])  # only the one it was asked about counts
    assert rollout_metrics([right, wrong])["episode/feedback/failed"] == 0.5  # into the step's record

    def wrong_length(completions, **kw):
        return ["a", "b", "c"]

    (t,) = _scored(_task(wrong_length), ["6"])
    assert not t.failed and t.feedback is None

    def slow(completions, **kw):
        time.sleep(2)
        return ["late"] * len(completions)

    t0 = time.perf_counter()
    (late,) = attach_feedback(_task(slow), [_traj("6", {"prompt": "x", "answer": "5"})], timeout_s=0.2)
    assert late.metrics == {"feedback/failed": 1.0} and time.perf_counter() - t0 < 1.5


def test_long_feedback_is_cut():
    (t,) = _scored(_task(lambda completions, **kw: ["x" * 10_000] * len(completions)), ["6"])
    assert len(t.feedback) == MAX_FEEDBACK_CHARS


def test_json_feedback_names_what_is_wrong():
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"]}
    exp = {"name": "Ada", "age": 36}
    out = json_feedback(['{"name": "Ada", "age": "36"}', "no json here", 'Sure: {"name": "Ada", "age": 36}',
                         '{"name": "Bob", "age": 36}', '{"name": "Ada", "age": 36}'],
                        schema=[schema] * 5, expected=[exp] * 5)
    assert "schema violation at age" in out[0] and "age should be 36" in out[0]
    assert "no JSON" in out[1]
    assert "only the JSON" in out[2]
    assert "name should be \"Ada\"" in out[3]
    assert out[4] is None


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=200))
def test_json_feedback_never_raises_on_any_text(text):
    (out,) = json_feedback([text], schema=[{"type": "object"}], expected=[{"a": [1, {"b": None}]}])
    assert out is None or isinstance(out, str)


def add(a: int, b: int = 0) -> int:
    """Add two numbers."""
    return a + b


def test_tool_env_feedback_names_the_turn_of_the_first_failed_call(tiny):
    _, tok = tiny
    rows = [{"prompt": [{"role": "user", "content": "2+3?"}], "answer": "5"}]

    def correct(completions, answer, **kw):
        return [float(c[0]["content"].strip() == a) for c, a in zip(completions, answer)]

    task = Task("t", rows, rows, Rubric([RewardComponent("correct", correct)]))
    env = ToolEnv(task, tok, SampleParams(max_tokens=32), [add], max_turns=4)
    sampler = ScriptedSampler(tok, ['<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>',
                                    '<tool_call>{"name": "mul", "arguments": {"a": 2}}</tool_call>',
                                    "<tool_call>{broken</tool_call>", "4"],
                              end_token_id=tok.convert_tokens_to_ids("<|im_end|>"))
    traj = asyncio.run(env.rollout(rows[0], sampler))
    assert traj.feedback_turn == 1 and "mul" in traj.feedback and "unknown tool" in traj.feedback
    assert json.loads(traj.to_json())["feedback_turn"] == 1
    assert Trajectory.from_dict(json.loads(traj.to_json())).feedback == traj.feedback
