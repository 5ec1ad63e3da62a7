"""Held-out evaluation with several samples per prompt (sampled pass@1 and pass@n)."""

import pytest

from posttrain.config import ConfigError, load_config
from posttrain.envs.single_turn import SingleTurnEnv
from posttrain.tasks import count_a
from posttrain.loop.evaluate import evaluate, pass_at_n
from posttrain.sampling.scripted import ScriptedSampler
from posttrain.types import SampleParams


def test_pass_at_n_counts_prompts_with_any_pass():
    assert pass_at_n([False, True, False, False, True, True], 2) == pytest.approx(2 / 3)
    assert pass_at_n([False] * 4, 2) == 0.0
    assert pass_at_n([True], 1) == 1.0


def test_eval_samples_rolls_out_n_per_prompt_and_averages(tiny):
    _, tok = tiny
    task = count_a.make_task()
    rows = task.eval_rows[:3]
    # Replies cycle through a passing-for-some and a failing text, so the samples of one prompt differ.
    sampler = ScriptedSampler(tok, ["a a a", "zzz", "a", "b b"])
    env = SingleTurnEnv(task, tok, SampleParams(max_tokens=8, temperature=1.0))
    m, trajs = evaluate(env, sampler, rows, SampleParams(max_tokens=8, temperature=1.0), samples=4)
    assert len(trajs) == 12 and sampler.calls == 12
    assert [t.row["prompt"] for t in trajs[:4]] == [rows[0]["prompt"]] * 4
    assert m["eval/rollouts/count"] == 12.0 and m["eval/samples_per_prompt"] == 4.0
    assert m["eval/pass_at_n"] == pass_at_n([t.passed for t in trajs], 4)
    assert m["eval/pass_rate"] == sum(t.passed for t in trajs) / 12 == 0.5  # "a a a" and "a" pass
    assert m["eval/pass_at_n"] == 1.0


def test_eval_samples_needs_a_temperature():
    with pytest.raises(ConfigError, match="eval_temperature"):
        load_config(None, ["loop.eval_samples=4"])
    cfg = load_config(None, ["loop.eval_samples=4", "sampling.eval_temperature=0.7"])
    assert cfg.loop.eval_samples == 4
    with pytest.raises(ConfigError):
        load_config(None, ["loop.eval_samples=0"])


def test_a_slow_eval_reports_progress(tiny):
    # Scripted replies that take 0.3 s: with every_s=0.1 the eval reports while rollouts are in flight, and the
    # result is the same as without progress.
    import asyncio

    from posttrain.loop.evaluate import evaluate_async

    _, tok = tiny
    task = count_a.make_task()
    rows = task.eval_rows[:2]
    params = SampleParams(max_tokens=8, temperature=0.0)
    env = SingleTurnEnv(task, tok, params)
    said: list[str] = []
    m, trajs = asyncio.run(evaluate_async(env, ScriptedSampler(tok, ["a a"], delay_s=0.3), rows, params,
                                          progress=said.append, every_s=0.1))
    assert said and all(s.startswith("eval: ") and "/2 rollouts done" in s for s in said)
    quiet, _ = asyncio.run(evaluate_async(env, ScriptedSampler(tok, ["a a"]), rows, params))
    assert len(trajs) == 2 and m["eval/pass_rate"] == quiet["eval/pass_rate"]


# ---- bounded: samples per prompt, rollouts alive at once (issue 60) -------------------------------------------------
class _Counting:
    """A sampler that counts the calls in flight at once (each takes a few ms, so rollouts started together
    overlap)."""

    def __init__(self, inner):
        self.inner, self.live, self.peak, self.calls = inner, 0, 0, 0

    policy_version = 0
    context = None

    def decode(self, token_ids):
        return self.inner.decode(token_ids)

    async def sample(self, prompts_P, params, n=1):
        import asyncio

        self.live += 1
        self.calls += 1
        self.peak = max(self.peak, self.live)
        try:
            await asyncio.sleep(0.002)
            return await self.inner.sample(prompts_P, params, n)
        finally:
            self.live -= 1


def test_eval_creates_its_rollouts_lazily_with_a_bounded_number_in_flight(tiny):
    # 3 prompts x 300 samples = 900 rollouts: the eval starts at most 256 of them at a time (EVAL_CONCURRENCY), each
    # as an earlier one finishes, and still returns all 900 in prompt order. Before: all 900 coroutines were
    # built up front and run at once (a million samples: a MemoryError after 94 s at 3.4 GiB).
    _, tok = tiny
    task = count_a.make_task()
    rows = task.eval_rows[:3]
    params = SampleParams(max_tokens=8, temperature=1.0)
    sampler = _Counting(ScriptedSampler(tok, ["a a", "b"]))
    m, trajs = evaluate(SingleTurnEnv(task, tok, params), sampler, rows, params, samples=300)
    assert sampler.calls == 900 and len(trajs) == 900 and m["eval/rollouts/count"] == 900.0
    assert [t.row["prompt"] for t in trajs[::300]] == [r["prompt"] for r in rows]
    assert 1 < sampler.peak <= 256, sampler.peak


def test_eval_samples_past_the_bound_are_refused():
    for over in (["loop.eval_samples=1025", "sampling.eval_temperature=0.7"],
                 ["eval_suite.samples=1000000", "eval_suite.temperature=0.7"]):
        with pytest.raises(ConfigError, match="less than or equal to 1024"):
            load_config(None, over)
    cfg = load_config(None, ["loop.eval_samples=1024", "sampling.eval_temperature=0.7", "eval_suite.samples=1024"])
    assert cfg.loop.eval_samples == cfg.eval_suite.samples == 1024


def test_evaluate_refuses_samples_past_the_bound(tiny):
    _, tok = tiny
    task = count_a.make_task()
    params = SampleParams(max_tokens=4, temperature=1.0)
    sampler = ScriptedSampler(tok, ["a"])
    with pytest.raises(ValueError, match="at most 1024"):  # the library call too, before a rollout is built
        evaluate(SingleTurnEnv(task, tok, params), sampler, task.eval_rows[:1], params, samples=1025)
    assert sampler.calls == 0
