"""`task.name=mixture` (tasks/mixture.py): several tasks in one run, each with its own env, rewards, max tokens and
stop strings; per-task metrics in every record and a per-task held-out table at the end."""

from __future__ import annotations

import asyncio
import collections
import json

import pytest

from posttrain.envs.base import make_env
from posttrain.envs.scoring import scored_by
from posttrain.envs.task import TaskLoadError
from posttrain.sampling.scripted import ScriptedSampler
from posttrain.tasks.load import load_task
from posttrain.types import TASK_COLUMN, SampleParams

THREE = [{"name": "count-a", "weight": 2}, {"name": "reversal", "options": {"size": 3}, "max_tokens": 6},
         {"name": "json-extract", "max_tokens": 12}]


def test_weights_set_the_share_of_training_prompts_and_evals_interleave():
    t = load_task("mixture", {"tasks": THREE})
    share = collections.Counter(r[TASK_COLUMN] for r in t.train_rows)
    total = sum(share.values())
    assert share["count-a"] / total == pytest.approx(0.5, abs=0.02)
    assert share["reversal"] / total == pytest.approx(0.25, abs=0.02)
    assert [r[TASK_COLUMN] for r in t.eval_rows[:6]] == ["count-a", "reversal", "json-extract"] * 2


def test_each_row_goes_to_its_own_env_with_its_own_max_tokens_and_is_scored_by_its_own_rubric(tiny):
    _, tok = tiny
    t = load_task("mixture", {"tasks": THREE})
    env = make_env(t, tok, SampleParams(max_tokens=64, temperature=1.0))
    asked = []

    class Recording(ScriptedSampler):
        async def sample(self, prompts_P, params, n=1):
            asked.append(params.max_tokens)
            return await super().sample(prompts_P, params, n)

    rows = {name: next(r for r in t.eval_rows if r[TASK_COLUMN] == name) for name in ("count-a", "json-extract")}

    async def go():
        out = {}
        for name, row in rows.items():
            traj = await env.rollout(row, Recording(tok, ["aaaa"]))
            (out[name],) = await scored_by(env, [traj])
        return out

    trajs = asyncio.run(go())
    assert asked == [16, 12]  # each part's own max_tokens (count-a's task says 16; the part says 12), not the run's 64
    count_a, json_ex = (load_task(n, {}).rubric.components for n in ("count-a", "json-extract"))
    assert set(trajs["count-a"].reward_components) == {c.name for c in count_a}  # scored by its own rubric
    assert set(trajs["json-extract"].reward_components) == {c.name for c in json_ex}
    assert trajs["count-a"].passed and not trajs["json-extract"].passed  # all a: count-a passes; "aaaa" is no JSON
    assert trajs["count-a"].row[TASK_COLUMN] == "count-a"  # the row keeps its tag (its part saw a copy without)


@pytest.mark.parametrize("tasks, match", [
    (None, "task.options.tasks: None: Input should be a valid list"),
    ([{"options": {}}], r"task.options.tasks\[0\].name: Field required"),
    ([{"name": "count-a", "weight": 0}], r"tasks\[0\].weight: 0: Input should be greater than 0"),
    ([{"name": "count-a", "wieght": 2}], r"tasks\[0\].wieght: unknown key \(did you mean 'weight'\?\)"),
    ([{"name": "count-a"}, {"name": "count-a"}], "must be unique"),
    ([{"name": "no-such-task"}], "unknown task"),
])
def test_bad_mixtures_are_refused_with_the_reason(tasks, match):
    with pytest.raises(TaskLoadError, match=match):
        load_task("mixture", {"tasks": tasks})


def test_a_three_task_run_logs_per_task_metrics_and_ends_with_a_per_task_table(tmp_path, capsys):
    from posttrain.config import load_config
    from posttrain.loop import train

    cfg = load_config(None, ["model.name=tiny-random", "task.name=mixture", f"task.options.tasks={json.dumps(THREE)}",
                             "logging.tensorboard=false", "loop.steps=3", "loop.prompts_per_step=4",
                             "loop.eval_prompts=6", "loop.save_every=0", "diagnostics.remedies.enabled=false",
                             f"run.output_dir={tmp_path}"])
    res = train(cfg)
    records = [json.loads(line) for line in (res.run_dir / "metrics.jsonl").read_text().splitlines()]
    train_recs = [r for r in records if r.get("kind") == "train"]
    evals = [r for r in records if r.get("kind") == "eval"]
    drawn = {k.split("/")[1] for r in train_recs for k in r if k.startswith("task/")}
    assert drawn and drawn <= {"count-a", "reversal", "json-extract"}
    for r in train_recs:
        for name in {k.split("/")[1] for k in r if k.startswith("task/")}:
            assert 0.0 <= r[f"task/{name}/pass_rate"] <= 1.0 and r[f"task/{name}/samples"] >= 1
    for e in evals:  # every eval covers every task (its rows interleave)
        assert {f"eval/task/{n}/pass_rate" for n in ("count-a", "reversal", "json-extract")} <= set(e)
    out = capsys.readouterr().out
    assert "held-out by task" in out and "reversal" in out and "json-extract" in out


def _mixture_from_config(tmp_path, *overrides):
    from posttrain.config import load_config
    from posttrain.tasks.from_config import task_from_config

    part = tmp_path / "part.py"  # a task file: its held-out rows are drawn with the seed load_task is given
    part.write_text("def make():\n    return [{'prompt': str(i)} for i in range(40)], [lambda completions, **kw: "
                    "[1.0] * len(completions)]\n")
    tasks = json.dumps([{"name": "count-a"}, {"name": f"{part}:make", "label": "file"}])
    cfg = load_config(None, ["task.name=mixture", f"task.options.tasks={tasks}", *overrides])
    return task_from_config(cfg.task, seed=cfg.run.seed)


def test_mixture_parts_use_the_runs_seed(tmp_path):
    one, two = (_mixture_from_config(tmp_path, f"run.seed={s}") for s in (1, 2))
    assert [r["prompt"] for r in one.train_rows] != [r["prompt"] for r in two.train_rows]  # the draw
    held = lambda t: [r["prompt"] for r in t.rubric.parts["file"].task.eval_rows]  # the part's split
    assert held(one) != held(two)
    assert held(one) == held(_mixture_from_config(tmp_path, "run.seed=1"))


def test_max_observation_chars_reaches_every_part(tmp_path):
    task = _mixture_from_config(tmp_path, "task.max_observation_chars=123")
    assert task.max_observation_chars == 123
    assert {p.task.max_observation_chars for p in task.rubric.parts.values()} == {123}
