"""RLTL;DR insights (guidance/insights.py): the memory keeps its bounds whatever is written and survives a resume,
conditioned prompts and the internalisation teacher read the same tokens, the env writes insights only from failed
samples, and the loop logs the share of conditioned rollouts and pass@1 with and without insights."""

import asyncio
import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.config import load_config
from posttrain.envs.single_turn import SingleTurnEnv
from posttrain.envs.task import Task
from posttrain.loop import train
from posttrain.loop.checkpoint import latest_checkpoint
from posttrain.loop.batch import env_hint
from posttrain.guidance.insights import InsightEnv, InsightMemory, clean_insight, condition_row, insight_block, row_key
from posttrain.guidance.teacher import SelfHintTeacher
from posttrain.models.template_check import render_ids
from posttrain.obs import read_metrics
from posttrain.rewards.rubric import RewardComponent, Rubric
from posttrain.sampling.scripted import ScriptedSampler
from posttrain.training.trainer import Trainer
from posttrain.types import Guidance, SampleParams, Trajectory, Turn, sequence_of
from posttrain.envs.base import score_groups


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 12), st.text(max_size=8)), max_size=120),
       st.integers(1, 4), st.integers(1, 6))
def test_memory_bounds_hold_for_any_writes(ops, per_task, max_tasks):
    mem = InsightMemory(per_task, max_tasks)
    for k, text in ops:
        mem.add(str(k), text, prompt=f"p{k}")
    assert len(mem) <= max_tasks
    for k in range(13):
        got = mem.get(str(k))
        assert len(got) <= per_task and len(set(got)) == len(got)
    # the newest insight of the last-written task is always kept
    if ops:
        k, text = ops[-1]
        assert mem.get(str(k))[-1] == text
    clone = InsightMemory(per_task, max_tasks)
    clone.load_state_dict(json.loads(json.dumps(mem.state_dict())))
    assert all(clone.get(str(k)) == mem.get(str(k)) for k in range(13))
    assert len(mem.pairs()) == sum(len(mem.get(str(k))) for k in range(13))


def test_memory_refuses_zero_bounds():
    with pytest.raises(ValueError, match=">= 1"):
        InsightMemory(0, 10)


def test_clean_insight_takes_the_first_line():
    assert clean_insight("\n - Use integers for ages.\nmore") == "Use integers for ages."
    assert clean_insight("   \n ") is None
    assert len(clean_insight("x" * 1000)) == 240


def test_condition_row_appends_to_the_last_message_or_text():
    chat = {"prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}], "answer": 1}
    out = condition_row(chat, ["a", "b"])
    assert out["prompt"][-1]["content"] == "q" + insight_block(["a", "b"]) and out["answer"] == 1
    assert chat["prompt"][-1]["content"] == "q"  # the task's row is never mutated
    assert condition_row({"prompt": "q"}, ["a"])["prompt"] == "q\n\nNotes from your earlier attempts:\n- a"
    assert condition_row(chat, []) is chat
    assert row_key(chat) == row_key(dict(chat)) != row_key({"prompt": "q"})


def test_internalisation_teacher_reads_exactly_the_conditioned_prompt(tiny):
    """The unconditioned sample's teacher context, token for token, is the prompt the conditioned rollouts see."""
    model, tok = tiny
    row = {"prompt": [{"role": "user", "content": "count the a"}]}
    insights = ["write many a", "no spaces"]
    plain = render_ids(tok, row["prompt"], add_generation_prompt=True)
    cond = render_ids(tok, condition_row(row, insights)["prompt"], add_generation_prompt=True)
    traj = Trajectory(turns=[Turn(plain, [5, 6, 7], [-1.0] * 3, 0)], guidance=Guidance(teacher_hint=insight_block(insights)))
    seq = sequence_of(traj, hint=env_hint(traj))
    view, _, _ = SelfHintTeacher(Trainer(model, pad_id=tok.pad_token_id), tok, max_hint_tokens=512).hinted(seq)
    assert view.prompt_ids == cond and view.completion_ids == [5, 6, 7]


def _task():
    def exact(completions, answer, **kw):
        return [float(c == a) for c, a in zip(completions, answer)]

    rows = [{"prompt": "2+3=", "answer": "5"}, {"prompt": "2+2=", "answer": "4"}]
    return Task("t", rows, rows, Rubric([RewardComponent("exact", exact)]),
                feedback=lambda completions, answer, **kw: [f"the answer is {a}" for a in answer])


def test_insight_env_writes_from_failed_samples_and_conditions_later_rollouts(tiny):
    _, tok = tiny
    task = _task()
    env = InsightEnv(SingleTurnEnv(task, tok, SampleParams(max_tokens=8)), InsightMemory(2), tok,
                     unconditioned_share=0.0, per_group=1)
    sampler = ScriptedSampler(tok, ["5", "7", "Add the two numbers carefully.\nignored"])
    row = task.train_rows[0]
    trajs = [asyncio.run(env.rollout(row, sampler)) for _ in range(2)]
    assert all(t.metrics["insights/conditioned"] == 0.0 for t in trajs)  # nothing in memory yet
    (trajs,) = asyncio.run(score_groups(env, [trajs]))  # scores, then the task's feedback on the scored records
    assert trajs[0].passed and not trajs[1].passed and trajs[1].feedback == "the answer is 5"
    assert env.memory.get(row_key(row)) == ["Add the two numbers carefully."]
    assert "insight_written" not in trajs[0].extra  # a pass writes nothing
    # the writer saw the task, its wrong attempt and the feedback
    written_from = tok.decode(sampler.prompts[-1])
    assert "2+3=" in written_from and "Your attempt:\n7" in written_from and "the answer is 5" in written_from
    t = asyncio.run(env.rollout(row, sampler))
    assert t.metrics["insights/conditioned"] == 1.0 and "Add the two numbers carefully." in t.row["prompt"]
    assert t.extra["base_row"] is row and "teacher_hint" not in t.extra
    env.unconditioned_share = 1.0
    t = asyncio.run(env.rollout(row, sampler))
    assert t.row is row and t.guidance.teacher_hint == insight_block(["Add the two numbers carefully."])


FAST = ["model.name=tiny-random", "task.name=count-a", "logging.tensorboard=false", "logging.console=false",
        "loop.eval_prompts=4", "loop.prompts_per_step=2", "loop.eval_before=false"]


def test_insights_in_the_loop_log_and_survive_resume(tmp_path):
    common = FAST + [f"run.output_dir={tmp_path}", "loop.save_every=1", "algorithm.insights.enabled=true",
                     "algorithm.insights.unconditioned_share=0.5", "task.options.n_train=2"]
    first = train(load_config(None, common + ["loop.steps=2"]))
    ckpt = torch.load(latest_checkpoint(first.run_dir) / "stepper.pt", weights_only=False)
    saved = ckpt["insights"]
    assert saved["items"], "two steps of failed count-a samples wrote no insight"
    res = train(load_config(None, common + ["loop.steps=3"]), run_dir=first.run_dir, resume=True)
    recs = [r for r in read_metrics(str(res.run_dir)) if r["kind"] == "train"]
    assert [r["step"] for r in recs] == [1, 2, 3]
    assert recs[-1]["insights/memory_tasks"] >= len(saved["items"])  # restored, not restarted empty
    assert recs[-1]["episode/insights/available"] > 0
    evals = [r for r in read_metrics(str(res.run_dir)) if r["kind"] == "eval"]
    assert "eval/insights/pass_rate" in evals[-1] and evals[-1]["eval/insights/pass_rate"] >= evals[-1]["eval/pass_rate"]


def test_an_insight_prompt_past_the_context_writes_no_insight_for_that_trajectory_alone(tiny):
    """Issue #52: one long attempt used to take the whole batched call (every trajectory's insight) down."""
    from posttrain.guidance.insights import write_insights
    from posttrain.sampling.context import ContextBudget
    from posttrain.sampling.scripted import ScriptedSampler
    from posttrain.types import SampleParams, Trajectory

    _, tok = tiny
    rows = {"prompt": [{"role": "user", "content": "2+2?"}]}
    short = Trajectory(turns=[], completion_text="5", row=rows, feedback="wrong sum")
    long_ = Trajectory(turns=[], completion_text="9" * 3000, row=rows, feedback="x" * 10_000)
    sampler = ScriptedSampler(tok, ["Check the sum first."], context=ContextBudget(700))
    got = asyncio.run(write_insights(sampler, tok, [short, long_, short], SampleParams(max_tokens=16)))
    assert got[0] == got[2] == "Check the sum first." and got[1] is None


def test_insight_env_leaves_the_rollouts_as_they_were_and_asks_for_feedback_once(tiny):
    """What the insight env learns while scoring (the task's feedback, the insight written) comes back as values in
    the scored records score_groups makes: the rollouts it was given are not edited through dicts a scored copy
    shares with them, and the task's feedback function is asked once per failed sample, not again by score_groups."""
    import copy

    _, tok = tiny
    asked = []

    def feedback(completions, answer, **kw):
        asked.extend(completions)
        return [f"the answer is {a}" for a in answer]

    rows = [{"prompt": "2+3=", "answer": "5"}]
    task = Task("t", rows, rows, Rubric([RewardComponent("exact", lambda completions, answer, **kw: [
        float(c == a) for c, a in zip(completions, answer)])]), feedback=feedback)
    env = InsightEnv(SingleTurnEnv(task, tok, SampleParams(max_tokens=8)), InsightMemory(2), tok,
                     unconditioned_share=0.0, per_group=1)
    sampler = ScriptedSampler(tok, ["5", "7", "Add carefully."])
    rolled = [asyncio.run(env.rollout(rows[0], sampler)) for _ in range(2)]
    before = copy.deepcopy(rolled)
    (got,) = asyncio.run(score_groups(env, [rolled]))
    assert rolled == before  # the rollouts given are as they were
    assert asked == ["7"]  # once, for the one failed sample
    assert got[1].feedback == "the answer is 5" and got[1].metrics["insights/written"] == 1.0
    assert got[1].extra["insight_written"] == "Add carefully." and "insights/written" not in got[0].metrics


def test_evaluate_with_insights_leaves_the_first_attempts_as_they_were(tiny):
    import copy

    from posttrain.guidance.insights import evaluate_with_insights

    _, tok = tiny
    task = _task()
    env = SingleTurnEnv(task, tok, SampleParams(max_tokens=8))
    sampler = ScriptedSampler(tok, ["7", "Add them.", "5"])
    (first,) = asyncio.run(score_groups(env, [[asyncio.run(env.rollout(task.eval_rows[0], sampler))]]))
    before = copy.deepcopy(first)
    m = asyncio.run(evaluate_with_insights(env, sampler, tok, first, SampleParams(max_tokens=8),
                                           SampleParams(max_tokens=8)))
    assert first == before and m["eval/insights/pass_rate"] == 1.0
