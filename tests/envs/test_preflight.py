"""Preflight verdicts: each verdict fires on a task built to trigger it, and not on a healthy one.

The tasks are real (rows + TRL-style reward functions, scored by the real env and rubric); the completions come
from a scripted sampler so each test is fast and deterministic. measurements_from + diagnose is the same path
`posttrain env check --preflight` takes after sampling with the model.
"""

import asyncio
from types import SimpleNamespace

from posttrain.envs import smoke_checks as K
from posttrain.loop import preflight as P
from posttrain.tasks.load import to_task
from posttrain.obs.preflight_verdicts import (PreflightMeasurements, diagnose, estimate_run_seconds, format_verdicts,
                                     measurements_from_metrics, worst)
from posttrain.envs.single_turn import SingleTurnEnv
from posttrain.sampling.scripted import ScriptedSampler
from posttrain.types import Completion, SampleParams
from posttrain.envs.scoring import scored_by

ROWS = [{"prompt": f"Q: What is {a} + 1?\nA:", "answer": a + 1} for a in range(8)]


def exact(completions, answer, **kw):
    return [1.0 if c.strip() == str(a) else 0.0 for c, a in zip(completions, answer)]


def half_if_number(completions, **kw):
    return [0.5 if any(ch.isdigit() for ch in c) else 0.0 for c in completions]


def raises_on_empty(completions, **kw):
    return [1.0 / len(c.strip()) for c in completions]  # ZeroDivisionError on an empty reply


class LengthSampler(ScriptedSampler):
    """A scripted sampler whose replies all ran into max_tokens (finish_reason "length")."""

    async def sample(self, prompts_P, params, n=1):
        out = await super().sample(prompts_P, params, n)
        return [[Completion(c.token_ids, c.logprobs, "length", c.policy_version, text=c.text) for c in row]
                for row in out]


def measure(tok, task_dict, replies, baseline_pass, sampler_cls=ScriptedSampler, g=4, steps=None, step_s=None):
    """Sample G scripted replies for 4 rows of the task, score them, and turn them into measurements."""
    task = to_task({"eval": task_dict["train"][:1], **task_dict}, "t")  # explicit eval: train rows keep their order
    params = SampleParams(max_tokens=8, temperature=0.7)
    env = SingleTurnEnv(task, tok, params)
    sampler = sampler_cls(tok, replies)

    async def groups():
        out = []
        for row in task.train_rows[:4]:
            trajs = [await env.rollout(row, sampler, params) for _ in range(g)]
            trajs = await scored_by(env, trajs)
            out.append(trajs)
        return out

    sampled = asyncio.run(groups())
    c = SimpleNamespace(task=task, tokenizer=tok, train_params=params)
    cfg = SimpleNamespace(loop=SimpleNamespace(steps=steps), algorithm=SimpleNamespace(num_generations=g))
    return P.measurements_from({"eval/pass_rate": baseline_pass}, sampled, c, cfg, True, "ok", step_s, 10.0)


def kinds(m):
    return {v.kind: v for v in diagnose(m)}


def test_never_firing_reward_gives_no_signal_verdict_with_advice(tiny):
    # The old custom task's failure: the model never gives the bare number, so the only reward never fires.
    m = measure(tiny[1], {"train": ROWS, "rewards": [exact]}, ["The answer is 3 + 1 = 4."], baseline_pass=0.0)
    assert m.zero_variance_frac == 1.0 and m.sampled_pass_rate == 0.0
    v = kinds(m)["no_signal"]
    assert v.severity == "stop" and "no learning signal" in v.message
    advice = " ".join(v.advice)
    for hint in ("partial credit", "demonstrate", "num_generations", "dynamic_sampling"):
        assert hint in advice
    assert worst(diagnose(m)) == "stop"


def test_partial_credit_that_fires_sometimes_is_not_no_signal(tiny):
    # Replies alternate bare-right / wordy: some groups have spread, so the verdict is not "no signal".
    task = {"train": ROWS, "rewards": [exact, half_if_number]}
    m = measure(tiny[1], task, ["1", "The answer is 1.", "2", "nothing"], baseline_pass=0.0, g=3)
    assert m.zero_variance_frac < 0.5 and m.sampled_pass_rate > 0
    found = kinds(m)
    assert "no_signal" not in found and "weak_signal" not in found and "ok" in found


def test_weak_signal_when_most_groups_are_flat_but_some_pass(tiny):
    # Only the first row (answer 1) gets some right replies; the other three groups are all wrong.
    m = measure(tiny[1], {"train": ROWS, "rewards": [exact]}, ["1", "x", "1", "x"] + ["x"] * 12, baseline_pass=0.25)
    assert 0.5 <= m.zero_variance_frac < 1.0
    assert kinds(m)["weak_signal"].severity == "warn"


def test_saturated_rewards(tiny):
    always = {"train": ROWS, "rewards": [lambda completions, **kw: [1.0] * len(completions)]}
    m = measure(tiny[1], always, ["anything"], baseline_pass=1.0)
    found = kinds(m)
    assert found["saturated"].severity == "warn" and "saturated at the top" in found["saturated"].message
    assert "no_signal" not in found and "weak_signal" not in found


def test_high_truncation_rate(tiny):
    m = measure(tiny[1], {"train": ROWS, "rewards": [exact, half_if_number]}, ["1 2 3 4 5 6 7 8 9", "2"],
                baseline_pass=0.3, sampler_cls=LengthSampler)
    assert m.truncated_frac == 1.0
    v = kinds(m)["truncation"]
    assert "max_tokens" in v.advice[0] and "stop" in v.advice[1] and "sampling.max_tokens=16" in v.advice[0]


def test_reward_function_that_raises(tiny):
    m = measure(tiny[1], {"train": ROWS, "rewards": [raises_on_empty]}, ["", "ok"], baseline_pass=0.0)
    assert m.reward_errors > 0 and m.samples == 16
    v = kinds(m)["reward_error"]
    assert v.severity == "warn" and "ZeroDivisionError" in v.message
    # Every sample raising is a stop: nothing would be trained on.
    m_all = measure(tiny[1], {"train": ROWS, "rewards": [raises_on_empty]}, [""], baseline_pass=0.0)
    assert kinds(m_all)["reward_error"].severity == "stop"


def test_chat_template_mismatch(tiny):
    _, tok = tiny
    orig = tok.chat_template
    try:  # renders only the last message: multi-turn token ids would not line up
        tok.chat_template = ("{{ '<|im_start|>' + messages[-1]['role'] + '\n' + messages[-1]['content'] + "
                             "'<|im_end|>\n' }}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
        ok, detail = P.chat_template_prefix_ok(tok)
    finally:
        tok.chat_template = orig
    m = PreflightMeasurements(0.3, 0.2, multi_turn=True, chat_template_ok=ok, chat_template_detail=detail)
    v = kinds(m)["chat_template"]
    assert not ok and v.severity == "stop" and "mismatch" in v.message
    # The same template on a single-turn task is harmless: no verdict.
    assert "chat_template" not in kinds(PreflightMeasurements(0.3, 0.2, chat_template_ok=ok))
    # Chat prompts with a tokenizer that has no template at all (the env refuses to render them; the verdict
    # says why in words a new user can act on).
    m = PreflightMeasurements(0.3, 0.2, chat_prompts_without_template=True)
    assert "no chat template" in kinds(m)["chat_template"].message


def test_time_estimate_from_a_probe_step(tiny):
    m = measure(tiny[1], {"train": ROWS, "rewards": [exact, half_if_number]}, ["1", "x"], baseline_pass=0.3,
                steps=30, step_s=4.0)
    v = kinds(m)["time"]
    assert v.severity == "info" and "4.0 s per training step" in v.message
    assert "30 steps" in v.message and f"{(4.0 * 30 + 2 * 10.0) / 60:.1f} min" in v.message
    assert estimate_run_seconds(4.0, 30, 10.0) == 140.0


def test_format_lists_worst_first_with_advice():
    m = PreflightMeasurements(0.0, 1.0, sampled_pass_rate=0.0, truncated_frac=0.5, max_tokens=8, step_seconds=2.0,
                              steps=10)
    vs = diagnose(m)
    assert [v.severity for v in vs] == ["stop", "warn", "info"]
    text = format_verdicts(vs)
    assert text.index("[STOP]") < text.index("[WARN]") < text.index("[INFO]")
    assert "      - add partial credit" in text


def test_measurements_from_a_runs_logged_metrics():
    # What the loop logs for the eval before training and for step 1 of a run with no signal.
    before = {"eval/pass_rate": 0.0, "eval/seconds": 30.0}
    step = {"groups/zero_variance_frac": 1.0, "pass_rate": 0.0, "reward/mean": 0.0, "completion/truncated_frac": 0.0,
            "rollouts/failed": 0.0, "rollouts/count": 16.0, "time/step": 5.0}
    got = measurements_from_metrics(before, step, steps=60, num_generations=4, max_tokens=16)
    found = kinds(got)
    assert found["no_signal"].severity == "stop" and "G=4" in found["no_signal"].message
    assert "60 steps" in found["time"].message and f"{(5.0 * 60 + 60) / 60:.1f} min" in found["time"].message
    assert "memory" not in found  # not logged: not said
    mem = kinds(measurements_from_metrics(before, dict(step, **{"perf/peak_rss_mb": 5530.0,
                                                                 "perf/mem_available_mb": 12288.0}), 60, 4))
    assert mem["memory"].severity == "info"
    assert mem["memory"].message == "peak memory after one step: 5.4 GB; 12.0 GB still available"
    healthy = measurements_from_metrics({"eval/pass_rate": 0.2}, dict(step, **{"groups/zero_variance_frac": 0.25,
                                                                                "pass_rate": 0.3}), 10, 4)
    assert worst(diagnose(healthy)) == "ok"


def test_a_long_run_is_told_how_to_bound_it_and_a_budget_shortens_the_estimate():
    # The demo's probe on a slow 2-core machine: 29.5 s a step, 28 s an eval, 60 steps: about 30 minutes.
    before = {"eval/pass_rate": 0.17, "eval/seconds": 28.0}
    step = {"groups/zero_variance_frac": 0.25, "pass_rate": 0.1, "time/step": 29.5}
    long = kinds(measurements_from_metrics(before, step, steps=60, num_generations=4))["time"]
    assert "60 steps and 2 held-out evals take about 30.4 min" in long.message
    assert long.advice and "loop.time_budget_s=840" in long.advice[0] and "about 29 steps" in long.advice[0]
    capped = kinds(measurements_from_metrics(before, step, steps=60, num_generations=4, time_budget_s=480))["time"]
    assert "17 steps" in capped.message and "after about 17 of 60" in capped.message and not capped.advice
    assert f"{(29.5 * 17 + 56) / 60:.1f} min" in capped.message
    short = kinds(measurements_from_metrics(before, dict(step, **{"time/step": 9.0}), steps=60, num_generations=4))
    assert not short["time"].advice  # 9.9 minutes: nothing to say


def test_a_budget_the_user_set_gets_no_advice_and_evals_that_fill_the_time_are_named():
    # A coding-agent run on the slow machine: 286 s a step, 537 s an eval, 8 steps, loop.time_budget_s=2700 set
    # (above the estimate, so it caps nothing): the user bounded it already, and was told to set a budget of 60.
    before = {"eval/pass_rate": 0.0, "eval/seconds": 537.0}
    step = {"groups/zero_variance_frac": 0.5, "pass_rate": 0.0, "time/step": 286.0}
    budgeted = kinds(measurements_from_metrics(before, step, steps=8, num_generations=4, time_budget_s=2700))["time"]
    assert "8 steps and 2 held-out evals take about 56.0 min" in budgeted.message and not budgeted.advice
    unbounded = kinds(measurements_from_metrics(before, step, steps=8, num_generations=4))["time"]
    assert "evals alone take about 18 min" in unbounded.advice[0] and "loop.eval_prompts" in unbounded.advice[0]
