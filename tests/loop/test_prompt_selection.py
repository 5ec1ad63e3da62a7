"""loop.prompt_selection (algos/prompt_selection.py): the selection functions are pure and keep their bounds for any
record (property tests), the adaptive one spends the step on prompts that can still teach, and a run with it resumes
exactly."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.config import load_config
from posttrain.loop import Run, train
from posttrain.loop.row_choice import UniformRows
from posttrain.loop.prompt_selector import PromptSelector
from posttrain.algos.prompt_selection import (SELECTIONS, PromptRecord, SelectionSettings, adaptive,
                                             prompts_for_step, uniform)
from posttrain.obs import read_metrics


def group(row: int, passed: int, n: int = 4, spread: bool | None = None):
    """A scored group: `passed` of `n` samples pass (reward 1), the rest reward 0, unless `spread` says."""
    rewards = [1.0] * passed + [0.0] * (n - passed)
    if spread is False:
        rewards = [rewards[0]] * n
    trajs = [SimpleNamespace(passed=i < passed, reward=r, failed=False) for i, r in enumerate(rewards)]
    return SimpleNamespace(task_index=row, trajectories_G=trajs)


def test_uniform_is_the_runs_old_draw():
    for step in range(7):
        assert uniform(PromptRecord(), 10, 4, step, 3, SelectionSettings()) == prompts_for_step(10, step, 4, 3)
        # the collectors' default row chooser draws the same rows
        assert UniformRows(3).rows_for(step, 4, [{}] * 10) == prompts_for_step(10, step, 4, 3)
    # epochs: 10 rows, 4 a step -> every row once in the first 10 draws
    assert sorted(prompts_for_step(10, 0, 4, 3) + prompts_for_step(10, 1, 4, 3) + prompts_for_step(10, 2, 4, 3)[:2]) \
        == list(range(10))


def test_adaptive_replays_the_learnable_retires_the_mastered_and_backs_off_the_hopeless():
    s = SelectionSettings(replay_share=0.5, retire_after=1, backoff_after=2, revisit_every=5, revisit_slots=1)
    rec = PromptRecord()
    rec.observe(0, [group(0, 4), group(1, 2), group(2, 0, spread=False), group(3, 1)])
    rec.observe(1, [group(2, 0, spread=False)])
    assert [rec.get(i).state(1, 2) for i in range(5)] == ["mastered", "learnable", "hopeless", "learnable", "fresh"]
    rows = adaptive(rec, 20, 4, 2, 0, s)
    assert len(set(rows)) == 4
    assert sorted(rows[:2]) == [1, 3]  # half the slots replay the learnable (ties in the seeded order)
    assert 0 not in rows and 2 not in rows  # the mastered and the hopeless wait for their revisit
    assert all(rec.get(r).state(1, 2) == "fresh" for r in rows[2:])
    # the revisit: 5 steps after it was last seen, the mastered prompt gets the revisit slot (oldest first)
    assert adaptive(rec, 20, 4, 5, 0, s)[0] == 0
    # a remedy: the hopeless prompt is learnable again
    rec.clear_backoff()
    assert rec.get(2).state(1, 2) == "learnable"
    rec.observe(3, [group(2, 0, spread=False)])  # seen again after the remedy: the flag is spent
    assert rec.get(2).state(1, 2) == "hopeless"


def test_a_group_whose_samples_all_failed_in_the_host_says_nothing():
    rec = PromptRecord()
    g = group(0, 0)
    for t in g.trajectories_G:  # SimpleNamespace stand-ins, not trajectories
        t.failed = True
    rec.observe(0, [g])
    assert rec.get(0).state(1, 2) == "fresh"


records = st.lists(st.tuples(st.integers(0, 29), st.integers(0, 40), st.integers(0, 4), st.booleans()), max_size=60)
knobs = st.tuples(st.floats(0, 1), st.integers(1, 3), st.integers(1, 3), st.integers(1, 12), st.integers(0, 3))


def _record(ops, up_to: int) -> PromptRecord:
    rec = PromptRecord()
    for row, step, passed, spread in sorted(ops, key=lambda o: o[1]):
        if step < up_to:
            rec.observe(step, [group(row, passed, 4, spread if 0 < passed < 4 else None)])
    return rec


@settings(max_examples=150, deadline=None)
@given(ops=records, knob=knobs, n_rows=st.integers(1, 30), k=st.integers(1, 8), step=st.integers(0, 60),
       seed=st.integers(0, 5))
def test_every_selection_returns_k_distinct_rows_in_range_and_is_a_pure_function(ops, knob, n_rows, k, step, seed):
    s = SelectionSettings(*knob)
    ops = [(r % n_rows, *rest) for r, *rest in ops]
    for name in SELECTIONS.names():
        fn = SELECTIONS[name]
        rows = fn(_record(ops, step), n_rows, k, step, seed, s)
        assert rows == fn(_record(ops, step), n_rows, k, step, seed, s)  # same record, step, seed: same rows
        assert all(0 <= r < n_rows for r in rows)
        if name == "adaptive":
            assert len(rows) == min(k, n_rows) and len(set(rows)) == len(rows)


@settings(max_examples=60, deadline=None)
@given(knob=knobs, n_rows=st.integers(8, 40), k=st.integers(1, 4), seed=st.integers(0, 5),
       outcomes=st.lists(st.integers(0, 4), min_size=40, max_size=40))
def test_in_a_run_a_parked_prompt_comes_back_no_more_often_than_the_revisit_rate(knob, n_rows, k, seed, outcomes):
    """Simulated runs: each prompt's groups pass `outcomes[row]` of 4 every time. While enough prompts are not
    parked, a retired or backed-off prompt is drawn at most once per revisit_every steps, and every fresh prompt is
    drawn within ceil(n_rows / fresh slots) steps."""
    s = SelectionSettings(*knob)
    rec, drawn_at = PromptRecord(), {}
    first_seen: dict[int, int] = {}
    fresh_slots = k - min(s.revisit_slots, k) - math.ceil((k - min(s.revisit_slots, k)) * s.replay_share)
    for step in range(40):
        parked_before = {r for r in range(n_rows) if rec.get(r).state(s.retire_after, s.backoff_after)
                         in ("mastered", "hopeless")}
        unparked = n_rows - len(parked_before)
        rows = adaptive(rec, n_rows, k, step, seed, s)
        for r in rows:
            if r in parked_before and unparked >= k:
                assert step - drawn_at[r] >= s.revisit_every, (r, step, drawn_at[r])
            drawn_at[r] = step
            first_seen.setdefault(r, step)
        rec.observe(step, [group(r, outcomes[r % 40], 4, False if outcomes[r % 40] in (0, 4) else True)
                           for r in rows])
    if fresh_slots > 0 and math.ceil(n_rows / fresh_slots) <= 40:
        assert set(first_seen) == set(range(n_rows))
        assert max(first_seen.values()) < math.ceil(n_rows / fresh_slots)


def test_the_record_round_trips_through_a_checkpoint():
    rec = PromptRecord()
    rec.observe(0, [group(0, 4), group(1, 2)])
    rec.observe(1, [group(2, 0, spread=False)])
    rec.clear_backoff()
    back = PromptRecord()
    back.load_state_dict(rec.state_dict())
    assert back.stats == rec.stats
    s = SelectionSettings()
    assert adaptive(back, 50, 4, 2, 1, s) == adaptive(rec, 50, 4, 2, 1, s)


def test_selector_metrics_count_what_it_parked_and_replayed():
    sel = PromptSelector("adaptive", 20, 0, SelectionSettings(revisit_every=50))
    sel.rows_for(0, 4)
    sel.observe(0, [group(0, 4), group(1, 2), group(2, 1), group(3, 4)])
    sel.rows_for(1, 4)
    m = sel.metrics([])
    assert m["select/retired"] == 2 and m["select/learnable"] == 2 and m["select/backed_off"] == 0
    assert m["select/replayed"] == 2 and m["select/fresh"] == 2 and m["select/revisited"] == 0


def test_an_unknown_selection_is_refused_by_the_config_with_the_nearest_name():
    with pytest.raises(ValueError, match="did you mean 'adaptive'"):
        load_config(None, ["loop.prompt_selection=adaptiv"])
    # RISED's own selection takes precedence (schedule.py; the run's start line says so): no refusal
    load_config(None, ["algorithm.rised.enabled=true", "loop.prompt_selection=adaptive"])


FAST = ["model.name=tiny-random", "task.name=count-a", "logging.tensorboard=false", "logging.console=false",
        "loop.eval_prompts=8"]


def _cfg(tmp_path, *extra):
    return load_config(None, FAST + [f"run.output_dir={tmp_path}", "loop.prompt_selection=adaptive",
                                     "loop.selection.revisit_every=3"] + list(extra))


def _train_records(run_dir):
    drop = ("time/", "perf/")
    return [{k: v for k, v in r.items() if not k.startswith(drop)}
            for r in read_metrics(str(run_dir)) if r["kind"] == "train"]


def test_a_run_with_adaptive_selection_resumes_exactly(tmp_path, crash_in_rl):
    common = ["loop.steps=6", "loop.save_every=3", "trainer.lr=3e-3", "run.seed=3", "algorithm.num_generations=4"]
    straight = train(_cfg(tmp_path / "a", *common))
    cfg = _cfg(tmp_path / "b", *common, "run.name=crashy")
    run = crash_in_rl(cfg, at_step=4)
    resumed = Run(cfg, run_dir=run.run_dir, resume=True).run()
    a, b = _train_records(straight.run_dir), _train_records(resumed.run_dir)
    assert [r["step"] for r in b] == [1, 2, 3, 4, 5, 6]
    assert a == b
    assert all("select/retired" in r for r in a)
    assert sum(r["select/replayed"] for r in a) > 0  # the record was used, not only carried
    assert all(isinstance(r["select/pass_by_prompt"], dict) and len(r["select/pass_by_prompt"]) == 4 for r in a)
    pytest.importorskip("plotly")
    from posttrain.obs.html_report import write_html_report

    html = write_html_report(straight.run_dir).read_text()
    assert 'id="curriculum"' in html and "pass rate of each drawn prompt" in html


def test_adaptive_selection_in_the_async_loop(tmp_path):
    res = train(_cfg(tmp_path, "loop.steps=4", "loop.mode=async", "loop.save_every=0"))
    recs = [r for r in read_metrics(str(res.run_dir)) if r["kind"] == "train"]
    assert len(recs) == 4 and all("select/learnable" in r for r in recs)
