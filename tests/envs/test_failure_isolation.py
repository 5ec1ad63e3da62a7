"""Per-sample failure isolation (issue #42): an env that raises on one sample's output fails that sample only, in
the sync and the async collector, in scoring, and in the held-out eval; the step goes on and counts it."""

import asyncio
import random

import pytest

from posttrain.config import load_config
from posttrain.envs.base import score_groups
from posttrain.envs.faults import FaultyEnv, InjectedFault, fault_draw
from posttrain.envs.isolate import FailureLog, safe_rollout, score_isolated
from posttrain.envs.scoring import scored_by
from posttrain.envs.single_turn import SingleTurnEnv
from posttrain.tasks import count_a
from posttrain.envs.tools import EnvWorkerLost
from posttrain.loop.async_collect import AsyncCollector, MeteredSampler
from posttrain.loop.batch import BatchOptions, build_batch, sequences_from_groups
from posttrain.algos.prompt_selection import prompts_for_step
from posttrain.loop.step_plan import CollectPlan
from posttrain.loop.collect import RolloutSpec, SyncCollector
from posttrain.loop.evaluate import evaluate_async
from posttrain.obs.rollout_stats import rollout_metrics, sample_records
from posttrain.obs.timers import BusyMeter, StageTimer
from posttrain.sampling.scripted import ScriptedSampler
from posttrain.types import SampleParams

P, G = 4, 2
CFG = ["model.name=tiny-random", "task.name=count-a", f"loop.prompts_per_step={P}",
       f"algorithm.num_generations={G}", "loop.steps=3", "run.seed=1"]


class RaisingEnv(SingleTurnEnv):
    """Raises, like a parser fed deeply nested JSON, whenever it rolls out one chosen row."""

    def __init__(self, task, tok, bad_row, exc=RecursionError("maximum recursion depth exceeded")):
        super().__init__(task, tok, SampleParams(max_tokens=8))
        self.bad_row, self.exc = bad_row, exc

    async def rollout(self, row, sampler, params=None):
        traj = await super().rollout(row, sampler, params)  # sampled first: the model's output is what breaks it
        if row is self.bad_row:
            raise self.exc
        return traj


def _setup(tok, step=0):
    task = count_a.make_task()
    rows = task.train_rows
    idx = prompts_for_step(len(rows), step, P, 1)
    return task, rows, idx


def _check_step(groups, bad_index, version=0):
    trajs = [t for g in groups for t in g.trajectories_G]
    assert len(groups) == P and len(trajs) == P * G
    bad = [t for g in groups if g.task_index == bad_index for t in g.trajectories_G]
    assert bad and all(t.failed and not t.passed and t.reward == 0.0 for t in bad)
    assert all(t.failed_in == "rollout" and "RecursionError" in t.error for t in bad)
    assert not any(t.failed for t in trajs if t not in bad)
    m = rollout_metrics(trajs)
    assert m["rollout/failed_rollout"] == len(bad) and m["rollout/failed_score"] == 0
    assert m["rollout/failed_frac"] == pytest.approx(len(bad) / len(trajs))
    assert m["rollouts/failed"] == len(bad)  # the existing count includes them
    # safe downstream: the batch leaves them out, the report's records take them
    seqs = sequences_from_groups(groups)
    assert len(seqs) == len(trajs) - len(bad)
    build_batch(seqs, BatchOptions())
    assert all(t.policy_version == version and t.sequence()[0] == t.prompt_ids for t in bad)
    assert all(t.prompt_text.startswith("[user] say a") for t in bad)  # the record says which prompt it was
    sample_records(trajs, len(trajs))


def test_sync_collector_fails_only_the_raising_sample(tiny):
    _, tok = tiny
    task, rows, idx = _setup(tok)
    env = RaisingEnv(task, tok, rows[idx[1]])
    cfg = load_config(None, CFG)
    sampler = ScriptedSampler(tok, ["aaa", "ab"])
    collector = SyncCollector(CollectPlan.from_config(cfg), RolloutSpec(env, sampler, rows, G, SampleParams(max_tokens=8)))
    collected = asyncio.run(collector.collect(0, StageTimer()))
    _check_step(collected.all_groups, idx[1])
    assert all(t.prompt_ids for g in collected.groups for t in g.trajectories_G)  # the row's prompt, for the record
    clean = [t for g in collected.all_groups if g.task_index != idx[1] for t in g.trajectories_G]
    assert "rollout/failed_frac" not in rollout_metrics(clean)  # a step without failures keeps its old record


def test_async_collector_workers_survive_a_raising_sample(tiny):
    _, tok = tiny
    task, rows, idx0 = _setup(tok, 0)
    _, _, idx1 = _setup(tok, 1)
    env = RaisingEnv(task, tok, rows[idx0[2]])
    cfg = load_config(None, CFG + ["loop.mode=async", "loop.max_staleness=0", "loop.batch_timeout_s=60"])
    meters = {k: BusyMeter() for k in ("model_call", "rollout")}
    sampler = ScriptedSampler(tok, ["aaa", "ab"])
    rollouts = RolloutSpec(env, MeteredSampler(sampler, meters["model_call"]), rows, G, SampleParams(max_tokens=8))
    collector = AsyncCollector(CollectPlan.from_config(cfg), rollouts, meters)

    async def go():
        try:
            first = await collector.collect(0, StageTimer())
            assert collector._failure is None and not any(w.done() for w in collector._workers)
            env.bad_row = rows[idx1[0]]  # the next step breaks on another row
            sampler.policy_version = 1
            await collector.on_weights(1)
            second = await collector.collect(1, StageTimer())
            return first, second
        finally:
            await collector.close()

    first, second = asyncio.run(go())
    _check_step(first.groups, idx0[2])
    _check_step(second.groups, idx1[0], version=1)


class FlakyScoreEnv(SingleTurnEnv):
    """Its batched score raises whenever the batch holds a completion with BAD in it."""

    async def score(self, trajectories):
        if any("BAD" in t.completion_text for t in trajectories):
            raise ValueError("scoring choked on " + "x" * 5000)  # a long message is cut in the record
        return await super().score(trajectories)


def test_score_raising_for_one_trajectory_fails_only_that_one(tiny):
    _, tok = tiny
    task = count_a.make_task()
    env = FlakyScoreEnv(task, tok, SampleParams(max_tokens=8))
    row = task.train_rows[0]
    sampler = ScriptedSampler(tok, ["aaa", "BAD", "a", "aa"])

    async def go():
        rolled = [await safe_rollout(env, row, sampler) for _ in range(4)]
        scored = await score_groups(env, [rolled[:2], rolled[2:]])
        plain = SingleTurnEnv(task, tok, SampleParams(max_tokens=8))
        ref = [await plain.rollout(row, ScriptedSampler(tok, [x])) for x in ("aaa", "a", "aa")]
        return [t for g in scored for t in g], await scored_by(plain, ref)

    trajs, ref = asyncio.run(go())
    assert [t.failed for t in trajs] == [False, True, False, False]
    bad = trajs[1]
    assert bad.failed_in == "score" and bad.error.startswith("score raised ValueError: scoring choked")
    assert len(bad.error) < 700 and bad.reward == 0.0 and not bad.passed
    # the others scored as if the bad one had never been in their batch
    assert [(t.reward, t.reward_components) for t in (trajs[0], trajs[2], trajs[3])] == \
        [(t.reward, t.reward_components) for t in ref]
    m = rollout_metrics(trajs)
    assert m["rollout/failed_score"] == 1 and m["rollout/failed_rollout"] == 0
    assert m["rollout/failed_frac"] == pytest.approx(0.25)


def test_a_failed_rollout_is_not_scored_back_to_life(tiny):
    """A rubric would score the failed sample's empty completion and clear `failed`."""
    _, tok = tiny
    task = count_a.make_task()
    env = RaisingEnv(task, tok, task.train_rows[0])

    async def go():
        t = await safe_rollout(env, task.train_rows[0], ScriptedSampler(tok, ["aaa"]))
        (t,) = await score_isolated(env, [t])
        return t

    t = asyncio.run(go())
    assert t.failed and t.failed_in == "rollout" and t.reward == 0.0


def test_eval_counts_a_raising_sample_instead_of_stopping(tiny):
    _, tok = tiny
    task = count_a.make_task()
    rows = task.eval_rows[:3]
    env = RaisingEnv(task, tok, rows[1], exc=UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed"))
    m, trajs = asyncio.run(evaluate_async(env, ScriptedSampler(tok, ["aaa"]), rows, SampleParams(max_tokens=8)))
    assert [t.failed for t in trajs] == [False, True, False]
    assert m["eval/rollout/failed_rollout"] == 1 and m["eval/rollout/failed_frac"] == pytest.approx(1 / 3)


class Raises(SingleTurnEnv):
    def __init__(self, task, tok, exc):
        super().__init__(task, tok, SampleParams(max_tokens=8))
        self.exc = exc

    async def rollout(self, row, sampler, params=None):
        raise self.exc


@pytest.mark.parametrize("exc", [asyncio.CancelledError(), KeyboardInterrupt(), EnvWorkerLost("worker died")])
def test_cancellation_interrupts_and_lost_workers_propagate(tiny, exc):
    _, tok = tiny
    task = count_a.make_task()
    env = Raises(task, tok, exc)
    with pytest.raises(type(exc)):
        asyncio.run(safe_rollout(env, task.train_rows[0], ScriptedSampler(tok, ["a"])))


def test_a_message_that_cannot_be_printed_still_fails_only_its_sample(tiny):
    class Unprintable(Exception):
        def __str__(self):
            raise RuntimeError("no")

    _, tok = tiny
    task = count_a.make_task()
    t = asyncio.run(safe_rollout(Raises(task, tok, Unprintable()), task.train_rows[0], ScriptedSampler(tok, ["a"])))
    assert t.failed and "Unprintable" in t.error


def test_failure_log_is_rate_limited(caplog):
    log = FailureLog(every_s=3600)
    with caplog.at_level("WARNING", logger="posttrain.envs.isolate"):
        for i in range(50):
            try:
                raise ValueError(f"bad {i}")
            except ValueError as e:
                log.note(f"rollout raised ValueError: bad {i}", e)
    lines = [r for r in caplog.records if r.name == "posttrain.envs.isolate"]
    assert len(lines) == 1 and "bad 0" in lines[0].getMessage() and "test_failure_isolation.py" in lines[0].getMessage()


def test_fault_injection_is_seeded_and_leaves_global_random_alone(tiny):
    _, tok = tiny
    task = count_a.make_task()
    row = task.train_rows[0]
    state = random.getstate()

    def pattern(seed):
        env = FaultyEnv(SingleTurnEnv(task, tok, SampleParams(max_tokens=4)), rate=0.3, seed=seed)
        sampler = ScriptedSampler(tok, ["a"])

        async def go():
            return await asyncio.gather(*(safe_rollout(env, row, sampler) for _ in range(200)))

        trajs = asyncio.run(go())
        assert all("InjectedFault" in t.error for t in trajs if t.failed)
        return [t.failed for t in trajs]

    a, b, c = pattern(0), pattern(0), pattern(1)
    assert a == b and a != c
    assert 0.2 < sum(a) / len(a) < 0.4
    assert a == [fault_draw(0, i) < 0.3 for i in range(200)]
    assert random.getstate() == state
    with pytest.raises(InjectedFault):
        env = FaultyEnv(SingleTurnEnv(task, tok, SampleParams(max_tokens=4)), rate=1.0, seed=0)
        asyncio.run(env.rollout(row, ScriptedSampler(tok, ["a"])))
    assert FaultyEnv(SingleTurnEnv(task, tok, SampleParams()), 0.5, 0).task is task  # the rest is the env's


def test_an_agent_env_batch_that_raises_is_scored_again_one_by_one(tiny):
    """AgentEnv marks the trajectories it must score (their NEEDS_RUBRIC mark); a batch that raised is scored again one
    by one from the same (unedited) records, so the good samples train with their reward."""
    pytest.importorskip("fastapi")
    pytest.importorskip("openai")
    from posttrain.envs.agent import NEEDS_RUBRIC, AgentEnv
    from posttrain.envs.task import Task
    from posttrain.rewards.rubric import Rubric

    _, tok = tiny

    def has_yes(completions, **kw):
        return [1.0 if "yes" in c else 0.0 for c in completions]

    rubric = Rubric.from_funcs([has_yes])
    plain_score = rubric.score

    def score(completions, rows, **extra):
        if any("BAD" in c for c in completions):
            raise RecursionError("a rubric internal choked on this batch")
        return plain_score(completions, rows, **extra)

    rubric.score = score
    task = Task("t", [{"prompt": "q", "answer": "yes"}], [], rubric)

    async def answer(client, row):
        r = await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": row["prompt"]}])
        return r.choices[0].message.content

    env = AgentEnv(answer, task=task, tokenizer=tok, timeout_s=30)

    async def go():
        s = ScriptedSampler(tok, ["yes it is", "BAD"])
        trajs = [await safe_rollout(env, {"prompt": "q", "answer": "yes"}, s) for _ in range(2)]
        ((good, bad),) = await score_groups(env, [trajs])
        await env.close()
        return trajs, good, bad

    rollouts, good, bad = asyncio.run(go())
    assert not good.failed and good.reward == 1.0 and good.passed
    assert bad.failed and bad.failed_in == "score" and "RecursionError" in bad.error
    assert all(NEEDS_RUBRIC in t.extra and t.reward == 0.0 and not t.failed for t in rollouts)  # records not edited


def test_the_step_line_shows_failed_samples():
    from posttrain.obs.console import step_line

    assert "failed=3/16" in step_line(2, 10, {"rollouts/failed": 3.0, "rollouts/count": 16.0})
    assert "failed=" not in step_line(2, 10, {"rollouts/failed": 0.0, "rollouts/count": 16.0})
