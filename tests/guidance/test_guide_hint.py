"""A remedy's guided format hint: samples drawn with the hint, trained as if the prompt had none.

Checked token for token on a single-turn and a multi-turn env; an env whose turns break the prefix contract keeps
its samples as sampled (counted); drift metrics leave guided samples out; the remedy policy starts a stall after
`no_pass_steps` steps without a pass, before any diagnostic."""

import asyncio

import pytest
import torch

from posttrain.config.schema import RemediesConfig
from posttrain.envs.single_turn import SingleTurnEnv
from posttrain.envs.task import Task
from posttrain.envs.tool_env import ToolEnv
from posttrain.loop.collect import RolloutSpec
from posttrain.guidance.guided_hint import first_prompt_ids, strip_prompt
from posttrain.obs.remedies import Overrides, Remedies
from posttrain.obs.timers import StageTimer
from posttrain.rewards.rubric import RewardComponent, Rubric
from posttrain.sampling.scripted import ScriptedSampler
from posttrain.types import SampleParams, Trajectory, Turn, sequence_of


def _one_word(completions, label, **kw):
    return [1.0 if (c[0]["content"] if isinstance(c, list) else c).strip() == lab else 0.3
            for c, lab in zip(completions, label)]


ROWS = [{"prompt": [{"role": "user", "content": "Sentiment of: great stuff"}], "label": "positive",
         "format_hint": "Answer in one word."}]


def _task():
    return Task("t", ROWS, ROWS, Rubric([RewardComponent("one_word", _one_word)]))


def _rollouts(env, tok, texts, guide):
    sampler = ScriptedSampler(tok, texts, end_token_id=tok.convert_tokens_to_ids("<|im_end|>"))
    base = RolloutSpec(env, sampler, ROWS, 2, SampleParams(max_tokens=16))
    return base.adjusted(Overrides(format_hint=True, guide=guide))


@pytest.mark.parametrize("guide", [True, False])
def test_single_turn_guided_samples_are_trained_on_the_plain_prompt(tiny, guide):
    _, tok = tiny
    env = SingleTurnEnv(_task(), tok, SampleParams(max_tokens=16))
    plain = env.prompt_ids(ROWS[0])
    hinted = env.prompt_ids({**ROWS[0], "prompt": [{"role": "user", "content": "Sentiment of: great stuff\n"
                                                                               "Answer in one word."}]})
    groups, _ = asyncio.run(_rollouts(env, tok, ["positive", "It is positive."], guide).groups([0], StageTimer()))
    trajs = groups[0].trajectories_G
    assert [t.reward for t in trajs] == [1.0, 0.3], "the reward is the task's, hint or not"
    for t in trajs:
        assert t.turns[0].prompt_ids == (plain if guide else hinted)
        assert t.guided is guide and sequence_of(t).guided is guide
        assert ("Answer in one word." in t.prompt_text) is not guide
        assert t.row is ROWS[0] if guide else t.row["format_hint"] == "Answer in one word."
    assert tok.decode(trajs[0].completion_ids, skip_special_tokens=True) == "positive"


def add(a: int, b: int = 0) -> int:
    """Add two numbers."""
    return a + b


def test_multi_turn_every_turn_loses_the_hint_and_keeps_the_rest(tiny):
    _, tok = tiny
    env = ToolEnv(_task(), tok, SampleParams(max_tokens=32), [add], max_turns=3)
    plain = asyncio.run(first_prompt_ids(env, ROWS[0], SampleParams(max_tokens=32)))
    texts = ['<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>', "positive"] * 2
    groups, _ = asyncio.run(_rollouts(env, tok, texts, True).groups([0], StageTimer()))
    t = groups[0].trajectories_G[0]
    assert len(t.turns) >= 2 and t.guided
    for u in t.turns:
        assert u.prompt_ids[:len(plain)] == plain
    assert "Answer in one word." not in tok.decode(t.turns[1].prompt_ids)
    assert "add" in tok.decode(t.turns[1].prompt_ids[len(plain):]), "the tool exchange after the prompt is kept"


def test_a_broken_prefix_contract_keeps_the_sample_as_sampled():
    t = Trajectory(turns=[Turn([1, 2, 9], [5], [-0.1], 0), Turn([1, 3, 9, 5, 7], [6], [-0.2], 0)],
                   prompt_text="q\nhint", row={"prompt": "q", "format_hint": "hint"})
    kept = strip_prompt(t, {"prompt": "q"}, [1, 2])
    assert not kept.guided and kept.turns == t.turns and kept.row == t.row
    assert kept.turns[0].prompt_ids == [1, 2, 9] and kept.metrics["guide_unstripped"] == 1.0
    assert not strip_prompt(t, {"prompt": "q"}, None).guided
    assert t.metrics == {}, "the sampled record is not edited"


def test_an_env_that_fails_before_asking_gives_no_plain_prompt():
    class Broken:
        async def rollout(self, row, sampler, params=None):
            raise RuntimeError("no")
    assert asyncio.run(first_prompt_ids(Broken(), {"prompt": "q"}, SampleParams())) is None


def test_drift_metrics_leave_guided_samples_out(tiny):
    from posttrain.algos import LOSSES, LossParams
    from posttrain.training.trainer import Trainer
    from posttrain.types import Batch, Sequence

    model, tok = tiny
    trainer = Trainer(model, pad_id=tok.pad_token_id)
    ids = tok("hello world", add_special_tokens=False)["input_ids"]
    lp = trainer.compute_logprobs(Batch([Sequence(ids[:2], ids[2:], [1] * len(ids[2:]), [0.0] * len(ids[2:]))]))[0]
    on = Sequence(ids[:2], ids[2:], [1] * len(lp), list(lp), advantage=1.0)
    far = Sequence(ids[:2], ids[2:], [1] * len(lp), [x - 3.0 for x in lp], advantage=-1.0)
    m_on = trainer.forward_backward(Batch([on]), LOSSES["ppo_clip"], LossParams()).metrics
    m_guided = trainer.forward_backward(Batch([on, Sequence(**{**far.__dict__, "guided": True})]), LOSSES["ppo_clip"],
                                        LossParams()).metrics
    m_plain = trainer.forward_backward(Batch([on, far]), LOSSES["ppo_clip"], LossParams()).metrics
    assert m_guided["train/sampler_kl_k3"] == pytest.approx(m_on["train/sampler_kl_k3"], abs=1e-5)
    assert m_plain["train/sampler_kl_k3"] > m_on["train/sampler_kl_k3"] + 0.5
    assert m_guided["train/loss_tokens"] == m_plain["train/loss_tokens"], "guided samples are still trained"


def _record(step, pass_rate, reward):
    return {"kind": "train", "step": step, "pass_rate": pass_rate, "reward/mean": reward, "reward/std": 0.1,
            "groups/zero_variance_frac": 0.25}


def test_steps_without_a_pass_start_a_stall_before_any_diagnostic():
    """A reward still climbing on partial credit is no plateau yet; no pass for no_pass_steps steps is enough."""
    for n, mode in ((3, "guide"), (3, "prompt"), (0, "guide")):
        rem = Remedies(RemediesConfig(enabled=True, no_pass_steps=n, format_hint_mode=mode), 0.7, 4)
        ovs = {s: rem.update(s, _record(s, 0.0, 0.05 * s), []) for s in range(1, 9)}
        if n == 0:
            assert all(ov.neutral for ov in ovs.values()), "without diagnostics nothing happens"
            continue
        assert ovs[2].neutral and ovs[3].num_generations == 8
        hinted = [s for s, ov in ovs.items() if ov.format_hint]
        assert hinted and min(hinted) == 3 + RemediesConfig().format_hint_after - 1
        assert all(ovs[s].guide is (mode == "guide") for s in hinted)
        if mode == "guide":  # the hint is the exploration: the sampler stays at the config's temperature
            assert all(ovs[s].temperature is None for s in hinted)
        else:
            assert ovs[8].temperature > 0.7


def test_without_hints_in_the_task_guide_mode_explores_by_temperature():
    rem = Remedies(RemediesConfig(enabled=True), 0.7, 4, has_format_hints=False)
    ovs = {s: rem.update(s, _record(s, 0.0, 0.05 * s), []) for s in range(1, 7)}
    assert not any(ov.format_hint for ov in ovs.values()) and ovs[6].temperature > 0.7


def test_a_pass_ends_the_early_stall_and_the_boost_decays():
    rem = Remedies(RemediesConfig(enabled=True), 0.7, 4)
    for s in range(1, 6):
        rem.update(s, _record(s, 0.0, 0.2), [])
    assert rem.current.format_hint
    levels = []
    for s in range(6, 14):
        levels.append(rem.update(s, _record(s, 0.25, 0.5), []).temperature)
    assert levels[-1] is None and rem.current.neutral, "passes again: back to the config"


def test_guide_share_samples_part_of_each_group_plain_and_reports_both_pass_rates(tiny):
    from posttrain.obs.rollout_stats import rollout_metrics

    _, tok = tiny
    env = SingleTurnEnv(_task(), tok, SampleParams(max_tokens=16))
    end = tok.convert_tokens_to_ids("<|im_end|>")
    sampler = ScriptedSampler(tok, ["positive", "It is positive."] * 2, end_token_id=end)
    base = RolloutSpec(env, sampler, ROWS, 4, SampleParams(max_tokens=16))
    groups, _ = asyncio.run(base.adjusted(Overrides(format_hint=True, guide=True, guide_share=0.5))
                            .groups([0], StageTimer()))
    trajs = groups[0].trajectories_G
    assert [t.guided for t in trajs] == [True, True, False, False]
    plain = env.prompt_ids(ROWS[0])
    assert all(t.turns[0].prompt_ids == plain for t in trajs), "every sample trains on the plain prompt"
    m = rollout_metrics(trajs)
    assert m["pass_rate/guided"] == 0.5 and m["pass_rate/unguided"] == 0.5 and m["episode/guided"] == 0.5
    # The hint goes to the self-hint teacher of the samples that did not pass (remedy_hint), before turn 0.
    from posttrain.loop.batch import remedy_hint
    assert [t.guidance.remedy_hint for t in trajs] == [None, "Answer in one word.", None, "Answer in one word."]
    assert remedy_hint(trajs[1]) == ("\n\nHint: Answer in one word.", 0) and remedy_hint(trajs[0]) is None
    assert all(t.feedback is None for t in trajs), "the task's own feedback channel is untouched"


def test_the_remedy_brings_its_own_hint_teacher_only_in_guide_mode_with_distill():
    from posttrain.config.schema import AlgorithmConfig
    from posttrain.training.from_config import self_teacher

    a = AlgorithmConfig()
    assert self_teacher(a, RemediesConfig(enabled=False)) is None, "remedies off: no teacher"
    own = self_teacher(a, RemediesConfig(enabled=True))
    assert own is not None and (own.kind, own.coef) == ("hint", a.hint_distill.coef)
    assert self_teacher(a, RemediesConfig(enabled=True, format_hint_distill=False)) is None
    assert self_teacher(a, RemediesConfig(enabled=True, format_hint_mode="prompt")) is None
    assert self_teacher(a, None) is None


def test_passes_of_guided_samples_alone_do_not_end_the_stall():
    rem = Remedies(RemediesConfig(enabled=True), 0.7, 4)
    for s in range(1, 6):
        rem.update(s, _record(s, 0.0, 0.2), [])
    assert rem.current.format_hint and rem.current.guide and rem.current.guide_share == 0.5
    level = rem.level
    rem.update(6, {**_record(6, 0.125, 0.3), "pass_rate/guided": 0.25, "pass_rate/unguided": 0.0}, [])
    assert rem.current.format_hint and rem.level > level, "the plain samples still never pass"
    level = rem.level
    rem.update(7, {**_record(7, 0.25, 0.4), "pass_rate/guided": 0.25, "pass_rate/unguided": 0.25}, [])
    assert rem.level < level, "the plain samples pass: the boost decays"


TASK_FILE = '''
def one_word(completions, label, **kw):
    return [1.0 if c.strip() == l else (0.3 if l in c else 0.0) for c, l in zip(completions, label)]


def make_task():
    rows = [{"prompt": f"Is {w} good? Label it yes or no.", "label": "yes", "format_hint": "One word."}
            for w in ["tea", "rain", "cake", "mud", "sun", "ice", "wind", "bread"]]
    return {"train": rows, "eval": rows[:2], "rewards": [one_word], "max_tokens": 6}
'''


def test_a_stalled_run_samples_guided_and_distills_from_the_hint(tmp_path):
    """End to end on tiny-random (which never passes): the stall starts after no_pass_steps, half of each group is
    then sampled with the hint and trained without it, and the hint teacher scores the samples that missed."""
    import json

    import posttrain

    (tmp_path / "hint_task.py").write_text(TASK_FILE)
    res = posttrain.train(loop__steps=6, model__name="tiny-random", task__name=f"{tmp_path}/hint_task.py:make_task",
                          loop__prompts_per_step=2, run__output_dir=str(tmp_path / "runs"), loop__eval_every=0,
                          diagnostics__remedies__enabled=True, task__env_check="off", loop__save_every=0)
    recs = [json.loads(x) for x in (res.run_dir / "metrics.jsonl").read_text().splitlines()]
    train = {r["step"]: r for r in recs if r.get("kind") == "train"}
    assert all(train[s].get("episode/guided", 0.0) == 0.0 for s in (1, 2, 3)), "no hint before the stall"
    guided = [s for s in train if train[s].get("episode/guided", 0.0) > 0]
    assert guided and min(guided) == 4, "stall at step 3 (no_pass_steps), hint from the next step"
    assert all(train[s]["episode/guided"] == 0.5 for s in guided)
    assert all(train[s]["hint/share"] > 0 for s in guided) and "train/hint/kl" in train[guided[0]]
    remedies = [r for r in recs if r.get("kind") == "remedy"]
    assert any(r["remedy"] == "format hint" for r in remedies)


def test_the_hint_stops_as_soon_as_the_plain_samples_pass_and_the_level_is_capped():
    rem = Remedies(RemediesConfig(enabled=True), 0.7, 4)
    for s in range(1, 30):  # a long stall
        rem.update(s, _record(s, 0.0, 0.2), [])
    assert rem.current.format_hint and rem.level == 4.0
    rem.update(30, {**_record(30, 0.1, 0.3), "pass_rate/guided": 0.1, "pass_rate/unguided": 0.1}, [])
    assert not rem.current.format_hint, "the plain samples pass: no more hint (nor its teacher)"
    for s in range(31, 35):
        rem.update(s, {**_record(s, 0.3, 0.5)}, [])
    ov = rem.current  # the boost winds down in a few steps, not log2(stall length)
    assert ov.num_generations is None and not ov.format_hint and (ov.temperature or 0.7) < 0.75
