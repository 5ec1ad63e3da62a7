"""Replay: a stored trajectory re-renders to the same prompt and re-scores (regrades) to the same reward."""

import json

from posttrain.envs.replay import replay
from posttrain.envs.single_turn import SingleTurnEnv
from posttrain.tasks import code_tests as C
from posttrain.models.chat import render_prompt
from posttrain.types import SampleParams, Trajectory, Turn
from posttrain.envs.scoring import scored_by


def _stored(task, row, text, tok, index):
    """A trajectory as SingleTurnEnv would produce and score it, round-tripped through JSON."""
    env = SingleTurnEnv(task, tok, SampleParams())
    ids = render_prompt(tok, row["prompt"])
    traj = Trajectory(turns=[Turn(ids, list(tok(text, add_special_tokens=False)["input_ids"]), [0.0] * 3, 0)],
                      prompt_text="\n".join(f"[{m['role']}] {m['content']}" for m in row["prompt"]),
                      completion_text=text, row=row)
    import asyncio

    (traj,) = asyncio.run(scored_by(env, [traj]))
    return env, json.loads(traj.to_json())


def test_code_task_trajectories_replay_to_the_same_reward(tiny):
    _, tok = tiny
    task = C.make_task()
    p = task.problems[task.train_rows[3]["problem_id"]]
    for text in (C.reference_completion(p), C.wrong_completion(p), "no code here"):
        env, stored = _stored(task, task.train_rows[3], text, tok, 3)
        rebuilt = C.make_task()  # a fresh env, built from the same options
        res = replay(rebuilt, stored, tokenizer=tok)
        assert res.ok, res.detail
        assert res.reward == stored["reward"] and res.components["tests_passed"] == stored["reward_components"]["tests_passed"]
        assert replay(env, stored).ok  # an env brings its own tokenizer


def test_replay_detects_changed_reward_and_prompt(tiny):
    _, tok = tiny
    task = C.make_task()
    p = task.problems[task.train_rows[0]["problem_id"]]
    _, stored = _stored(task, task.train_rows[0], C.reference_completion(p), tok, 0)
    tampered = dict(stored, reward=0.25)
    res = replay(task, tampered)
    assert res.observations_equal and not res.reward_equal and "stored 0.2500" in res.detail
    moved = json.loads(json.dumps(stored))
    moved["row"]["prompt"][1]["content"] += " (edited)"
    res = replay(task, moved)
    assert not res.observations_equal and "no row" in res.detail
    changed_tests = json.loads(json.dumps(stored))
    changed_tests["row"]["tests"] = changed_tests["row"]["tests"][:1]
    assert not replay(task, changed_tests).observations_equal


def test_replay_text_task(tiny):
    from posttrain.tasks import count_a

    _, tok = tiny
    task = count_a.make_task()
    _, stored = _stored(task, task.train_rows[1], "a cat sat", tok, 1)
    res = replay(count_a.make_task(), stored, tokenizer=tok)
    assert res.ok and abs(res.reward - 3 / 9) < 1e-9
