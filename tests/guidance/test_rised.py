"""RISED (rewards/tags.py, guidance/profiles.py): vocabularies are checked when loaded, rules tag what they say, a
failing judge or rule is counted and the run goes on, selection matches a composition without repeating rows,
and the profile env penalises, steers and hints as configured."""

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.config import load_config
from posttrain.envs.single_turn import SingleTurnEnv
from posttrain.loop import train
from posttrain.guidance.insights import row_key
from posttrain.guidance.profiles import ProfileBook, ProfileEnv, Rised, batch_profile, select_rows
from posttrain.obs import read_metrics
from posttrain.rewards.judges.errors import JudgeTimeout
from posttrain.rewards.tags import (DEFAULT_VOCABULARY, JudgeTagger, RuleTagger, Tag, Taggers, VocabularyError,
                                    load_vocabulary)
from posttrain.sampling.scripted import ScriptedSampler
from posttrain.types import SampleParams, Trajectory, Turn
from posttrain.envs.scoring import scored_by


def _traj(text, finish="stop", **kw):
    return Trajectory(turns=[Turn([1], [2], [-0.1], 0, finish_reason=finish)], completion_text=text, **kw)


def test_rules_tag_json_behaviours():
    tagger = RuleTagger(DEFAULT_VOCABULARY)
    only, prose, bad, cut = (_traj('{"a": 1}'), _traj('Sure! {"a": 1}'), _traj("no json"),
                             _traj('{"a": ', finish="length"))
    tags = tagger.tag([only, prose, bad, cut])
    assert "only_json" in tags[0] and "prose_around_json" not in tags[0]
    assert "prose_around_json" in tags[1] and "only_json" not in tags[1]
    assert "invalid_json" in tags[2] and "truncated" in tags[3]
    calls = _traj("x", tool_calls=[{"name": "f", "arguments": {}}] * 2)
    assert "repeated_tool_call" in tagger.tag([calls])[0]


def test_vocabulary_loads_and_refuses_bad_files(tmp_path):
    good = tmp_path / "v.yaml"
    good.write_text("tags:\n  - {name: polite, polarity: positive, description: the reply is polite}\n"
                    "  - {name: cut, polarity: negative, description: cut off, rule: truncated}\n")
    v = load_vocabulary(good)
    assert [t.name for t in v] == ["polite", "cut"] and v[0].rule is None
    assert load_vocabulary(None) == DEFAULT_VOCABULARY
    for body, match in [("tags: []", "non-empty"), ("- a", "tags:"), ("tags:\n  - {polarity: positive}", "needs a name"),
                        ("tags:\n  - {name: a, polarity: meh, description: d}", "polarity"),
                        ("tags:\n  - {name: a, polarity: positive}", "description"),
                        ("tags:\n  - {name: a, polarity: positive, description: d}\n  - {name: a, polarity: "
                         "positive, description: d}", "twice"),
                        ("tags:\n  - {name: a, polarity: positive, description: d, rule: nope}", "unknown rule"),
                        ("tags:\n  - {name: a, polarity: positive, description: d, rule: 'os:nope'}", "cannot be imported")]:
        bad = tmp_path / "bad.yaml"
        bad.write_text(body)
        with pytest.raises(VocabularyError, match=match):
            load_vocabulary(bad)
    with pytest.raises(VocabularyError, match="cannot read"):
        load_vocabulary(tmp_path / "missing.yaml")


class _Runner:
    def __init__(self, answers):
        self.answers = answers

    def ask(self, kind, template, prompts):
        if isinstance(self.answers, Exception):
            raise self.answers
        return [self.answers[i % len(self.answers)] for i in range(len(prompts))]


def test_a_failing_judge_is_counted_and_tags_nothing():
    vocab = [Tag("polite", "positive", "the reply is polite"), Tag("rude", "negative", "the reply is rude")]
    judge = JudgeTagger(vocab, _Runner([0.9, JudgeTimeout("late")]))
    assert judge.tag([_traj("hi")]) == [{"polite"}] and judge.errors == 1
    down = JudgeTagger(vocab, _Runner(RuntimeError("endpoint down")))
    assert down.tag([_traj("a"), _traj("b")]) == [set(), set()] and down.errors == 4
    raising = RuleTagger([Tag("x", "negative", "d", "posttrain.rewards.tags:truncated")])
    assert raising.tag([Trajectory(turns=[], completion_text="")]) == [set()]  # no turns: the rule raises
    assert raising.errors == 1
    taggers = Taggers(RuleTagger(DEFAULT_VOCABULARY), down)
    t = _traj('{"a": 1}')
    taggers.tag([t])
    assert "only_json" in t.guidance.tags and taggers.errors == 4 + 2  # two judge questions more failed


def test_selection_matches_the_target_and_skips_recent_rows():
    target = {"a": 0.5, "b": 0.0}
    profiles = [{"a": 1.0, "b": 0.0}, {"a": 1.0, "b": 0.0}, {"a": 0.0, "b": 0.0}, {"a": 0.0, "b": 1.0}, None]
    picked = select_rows(profiles, 2, target, excluded=set())
    assert sorted(picked) in ([0, 2], [1, 2], [0, 4], [1, 4], [2, 4]) and 3 not in picked
    assert 0 not in select_rows(profiles, 2, target, excluded={0}) and 1 not in select_rows(profiles, 2, target, {1})
    assert select_rows(profiles, 3, None, excluded={0}) == [1, 2, 3]
    assert select_rows(profiles, 2, target, set(), seed=3) == select_rows(profiles, 2, target, set(), seed=3)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.none(), st.fixed_dictionaries({"a": st.floats(0, 1), "b": st.floats(0, 1)})),
                min_size=1, max_size=12), st.integers(1, 6), st.sets(st.integers(0, 11)))
def test_selection_always_returns_k_distinct_rows(profiles, k, excluded):
    k = min(k, len(profiles))
    picked = select_rows(profiles, k, {"a": 0.3, "b": 0.6}, excluded)
    assert len(picked) == k == len(set(picked)) and all(0 <= i < len(profiles) for i in picked)
    allowed = [i for i in range(len(profiles)) if i not in excluded]
    if len(allowed) >= k:
        assert set(picked) <= set(allowed)


def test_rised_choose_never_repeats_within_the_window():
    rows = [{"prompt": f"p{i}"} for i in range(8)]
    r = Rised(DEFAULT_VOCABULARY, Taggers(RuleTagger(DEFAULT_VOCABULARY)), ProfileBook([t.name for t in DEFAULT_VOCABULARY]),
              candidates=4, window=1)
    first = r.choose(0, [0, 1, 2, 3, 4, 5, 6, 7], rows, 2)
    second = r.choose(1, [0, 1, 2, 3, 4, 5, 6, 7], rows, 2)
    assert not set(first) & set(second) and r.overlap == 0


def _task():
    from posttrain.envs.task import Task
    from posttrain.rewards.json_rewards import json_rubric

    rows = [{"prompt": "give a", "schema": {"type": "object"}, "expected": {"a": 1}}]
    return Task("t", rows, rows, json_rubric())


def test_profile_env_penalises_hints_and_steers(tiny):
    _, tok = tiny
    vocab = DEFAULT_VOCABULARY
    book = ProfileBook([t.name for t in vocab])
    env = ProfileEnv(SingleTurnEnv(_task(), tok, SampleParams(max_tokens=16)), Taggers(RuleTagger(vocab)), vocab, book,
                     negative="penalty", penalty=0.1)
    sampler = ScriptedSampler(tok, ['Here: {"a": 1}', '{"a": 1}'])
    row = env.task.train_rows[0]
    trajs = [asyncio.run(env.rollout(row, sampler)) for _ in range(2)]
    trajs = asyncio.run(scored_by(env, trajs))
    prose, clean = trajs
    assert "prose_around_json" in prose.guidance.tags and prose.reward_components["rised_penalty"] == pytest.approx(-0.1)
    assert clean.reward_components["rised_penalty"] == 0.0
    # only_json: the clean sample of the same prompt showed it, so the prose one is hinted toward it; 'solved' no
    # rollout of this prompt reached, so nobody is hinted toward it
    assert "only the JSON" in prose.guidance.teacher_hint and "Make sure" in prose.guidance.teacher_hint
    assert "correct" not in prose.guidance.teacher_hint and clean.guidance.teacher_hint is None
    assert book.get(row_key(row))["prose_around_json"] == 0.5
    # overlapping negative tags cost one penalty, so prose is never cheaper than nearly-right JSON
    many = [asyncio.run(env.rollout(row, ScriptedSampler(tok, [x]))) for x in ('{"a": 2}', "no json at all")]
    many = asyncio.run(scored_by(env, many))
    assert len([x for x in many[0].guidance.tags if x in ("wrong_value", "schema_violation", "invalid_json")]) >= 1
    assert many[0].reward_components["rised_penalty"] == many[1].reward_components["rised_penalty"] == pytest.approx(-0.1)
    env.negative = "hint"
    book.update(row_key(row), [["prose_around_json"]] * 4)
    t = asyncio.run(env.rollout(row, sampler))
    assert "Avoid: the answer has prose around the JSON" in t.row["prompt"] and t.extra["steered"]
    assert batch_profile([["a"], []], ["a", "b"]) == {"a": 0.5, "b": 0.0}


FAST = ["model.name=tiny-random", "task.name=json-extract", "logging.tensorboard=false", "logging.console=false",
        "loop.eval_prompts=2", "loop.prompts_per_step=2", "loop.eval_before=false", "sampling.max_tokens=12",
        "algorithm.rised.enabled=true"]


def test_rised_in_the_loop_with_a_judge_that_fails(tmp_path, monkeypatch):
    """A project tag the judge decides, and a judge whose every call fails: counted each step, training goes on."""
    from posttrain.rewards.judges.local_hf import LocalHFBackend

    def down(self, prompts):
        raise ConnectionError("judge endpoint down")

    monkeypatch.setattr(LocalHFBackend, "yes_prob", down)
    vocab = tmp_path / "v.yaml"
    vocab.write_text("tags:\n  - {name: polite, polarity: positive, description: the reply is polite}\n"
                     "  - {name: cut, polarity: negative, description: cut off, rule: truncated}\n")
    res = train(load_config(None, FAST + [f"run.output_dir={tmp_path}", "loop.steps=2", "loop.save_every=2",
                                          f"algorithm.rised.vocabulary={vocab}", "algorithm.rised.judge_model=tiny-random",
                                          "judge.cache=null"]))
    recs = [r for r in read_metrics(str(res.run_dir)) if r["kind"] == "train"]
    assert len(recs) == 2 and recs[-1]["rised/tag_errors"] > 0
    assert recs[-1]["rised/cut"] >= 0.0 and "rised/polite" in recs[-1]
    # 'polite' never came back from the judge, so no rollout showed it and no sample is hinted toward it
    assert recs[0]["hint/share"] == 0.0
    from posttrain.obs.html_report import write_html_report

    html = write_html_report(res.run_dir).read_text()
    assert "Behaviour profile" in html and "fig-profile" in html


def test_config_refuses_two_self_teachers_and_async_selection():
    with pytest.raises(Exception, match="turn on one per run"):
        load_config(None, ["algorithm.rised.enabled=true", "algorithm.insights.enabled=true"])
    load_config(None, ["algorithm.rised.enabled=true", "algorithm.rised.positive_distill=false",
                       "algorithm.insights.enabled=true"])
    with pytest.raises(Exception, match="loop.mode=sync"):
        load_config(None, ["algorithm.rised.enabled=true", "loop.mode=async"])
