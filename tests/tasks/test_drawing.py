"""The built-in `drawing` task: rubric, env check, metrics, the judge hook, and serving it over OpenEnv."""

from __future__ import annotations

import asyncio

import pytest

from posttrain.envs.smoke_checks import check_task, score_completion
from posttrain.envs.task import Task
from posttrain.tasks import builtin_task_factory
from posttrain.tasks.drawing import make_task, program_text
from posttrain.rewards.telemetry import drain_task_metrics


@pytest.fixture(scope="module")
def task() -> Task:
    return make_task()


def test_demonstrations_are_the_references(task: Task) -> None:
    row = task.train_rows[3]
    (reply,) = task.demonstrate(row)
    assert reply == row["reference"] and score_completion(task, row, reply).passed


def test_shape(task: Task) -> None:
    assert builtin_task_factory("drawing") is make_task
    assert len(task.train_rows) >= 40 and len(task.eval_rows) >= 15
    assert [c.name for c in task.rubric.components] == ["drawing_gate", "drawing_length", "drawing_image"]
    assert task.rubric.gates == ["drawing_gate"] and not task.judges
    row = task.train_rows[0]
    assert row["description"] in row["prompt"][1]["content"] and "wash(color, alpha)" in row["prompt"][1]["content"]


def test_env_check_passes(task: Task) -> None:
    results = check_task(task)
    assert len(results) >= 4 and all(r.ok for r in results), results


def test_reference_beats_junk_and_gate_zeroes(task: Task) -> None:
    for row in task.eval_rows:
        ref = score_completion(task, row, row["reference"])
        assert ref.passed and ref.components["drawing_image"] == pytest.approx(1.0)
        blank = score_completion(task, row, 'fill("white")')
        assert blank.reward < ref.reward - 0.3 and not blank.passed
    row = task.train_rows[0]
    cheat = score_completion(task, row, "x = ().__class__\n" + row["reference"])
    assert cheat.reward == 0.0 and not cheat.passed and cheat.components["drawing_gate"] == 0.0
    crash = score_completion(task, row, row["reference"] + "\nx = 1 / 0")  # passes the gate, fails to render
    assert crash.reward == 0.0
    drain_task_metrics(task)


def test_shorter_is_slightly_better(task: Task) -> None:
    row = task.train_rows[0]
    a = score_completion(task, row, row["reference"])
    b = score_completion(task, row, row["reference"] + "\npass" * 40)  # same picture, longer program
    assert b.components["drawing_image"] == a.components["drawing_image"] and 0 < a.reward - b.reward < 0.05


def test_a_blank_page_earns_only_the_gate(task: Task) -> None:
    """The length term used to pay any gated program: `fill("white")` (13 characters, draws nothing) then beat a
    real attempt whose picture scored 0, and RL converged on it. Now it earns the gate's 0.1 and nothing else, and a
    short blank page never outscores a long program that draws something."""
    row = task.train_rows[0]
    blank = score_completion(task, row, 'fill("white")')
    assert blank.components["drawing_gate"] == 1.0
    assert blank.components["drawing_image"] == 0.0 and blank.components["drawing_length"] == 0.0
    assert blank.reward == pytest.approx(0.1)
    drawn = score_completion(task, row, row["reference"] + "\npass" * 40)
    assert drawn.components["drawing_length"] > 0.0 and drawn.reward > blank.reward + 0.5
    drain_task_metrics(task)


def test_program_text() -> None:
    assert program_text("```python\nfill('red')\n```\nsome prose") == "fill('red')"
    assert program_text("Here is the drawing:\n```python\nfill('red')\ncircle(1, 2, 3, 'red')") == \
        "fill('red')\ncircle(1, 2, 3, 'red')"  # cut at the stop before its closing fence
    assert program_text("Here is the drawing: fill('red')") == "Here is the drawing: fill('red')"  # the gate refuses it
    assert program_text([{"role": "assistant", "content": "fill('red')\n"}]) == "fill('red')"


def test_render_metrics() -> None:
    task = make_task()  # fresh: an empty render cache
    rows = task.train_rows[:3]
    comps = [[{"role": "assistant", "content": c}] for c in (rows[0]["reference"], rows[1]["reference"], "import os")]
    task.rubric.score(comps, [{k: v for k, v in r.items() if k != "prompt"} for r in rows])
    m = drain_task_metrics(task)
    assert m["drawing/checked"] == 3 and m["drawing/gate_pass_rate"] == pytest.approx(2 / 3)
    assert m["drawing/renders"] == 2 and m["drawing/render_ms"] > 0  # each program once: the cache serves the rest


def test_bad_options() -> None:
    with pytest.raises(ValueError, match="judge must be"):
        make_task(judge="clip")
    with pytest.raises(ValueError, match="cannot load the scorer"):
        make_task(judge="no_such_module_xyz:score")
    with pytest.raises(ValueError, match="unknown weight"):
        make_task(weights={"beauty": 1.0})


def test_learned_scorer_hook(tmp_path, monkeypatch) -> None:
    (tmp_path / "my_scorer.py").write_text(
        "def score(images, descriptions):\n"
        "    # share of red-ish pixels: a stand-in for a learned image scorer\n"
        "    out = []\n"
        "    for im in images:\n"
        "        px = im.tobytes()\n"
        "        n = len(px) // 3\n"
        "        out.append(sum(px[3*i] > 150 and px[3*i+1] < 100 for i in range(n)) / n)\n"
        "    return out\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    t = make_task(judge="my_scorer:score", judge_weight=0.5)
    row = t.train_rows[0]  # a red sun
    red = score_completion(t, row, 'fill("red")')
    blue = score_completion(t, row, 'fill("blue")')
    assert red.components["judge"] == 1.0 and blue.components["judge"] == 0.0
    assert score_completion(t, row, "import os").components["judge"] == 0.0  # gated out before the judge


def test_served_over_openenv_scores_reference_above_junk(task: Task, tiny) -> None:
    pytest.importorskip("fastapi")
    httpx = pytest.importorskip("httpx")
    from posttrain.envs.openenv_server import create_task_app
    from posttrain.sampling.http_serve import serve_in_loop

    _, tok = tiny
    app = create_task_app(task, tok, action_timeout_s=10)
    row = task.train_rows[0]

    async def go():
        async with serve_in_loop(app) as srv:
            async with httpx.AsyncClient(base_url=srv.url, timeout=10) as h:
                good = (await h.post("/step", json={"action": {"message": row["reference"]}, "index": 0})).json()
                junk = (await h.post("/step", json={"action": {"message": "print('hi')"}, "index": 0})).json()
        return good, junk

    good, junk = asyncio.run(asyncio.wait_for(go(), 60))
    assert good["done"] and good["observation"]["passed"] and good["reward"] > 1.0
    assert junk["done"] and junk["reward"] == 0.0


def test_llm_judge_option(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("POSTTRAIN_JUDGE_CACHE", str(tmp_path / "judge.sqlite"))
    t = make_task(judge="llm", judge_model="tiny-random")
    assert set(t.judges) == {"judge"} and t.rubric.components[-1].name == "judge"
    row = t.train_rows[0]
    s = score_completion(t, row, row["reference"])
    assert not s.failed, s.error
    assert 0.0 <= s.components["judge"] <= 1.0
    assert score_completion(t, row, "import os").components["judge"] == 0.0  # never asked: gated out


def test_smoke_checks_do_not_reach_the_metrics() -> None:
    t = make_task()
    check_task(t)
    assert drain_task_metrics(t) == {}


def test_generated_pictures_are_distinct_fixed_and_never_held_out() -> None:
    from posttrain.tasks import drawing_data as D
    from posttrain.tasks.drawing_scenes import FAMILIES, generate

    scenes = generate(300)
    assert scenes == generate(300)  # the generator's own seed: every run trains on the same pictures
    descriptions = [d for d, _ in scenes]
    assert len(set(descriptions)) == 300
    assert not set(descriptions) & ({d for d, _ in D.HELD_OUT} | {d for d, _ in D.TRAIN})
    # the families take turns: each one's closing word shows up in the first len(FAMILIES) pictures
    endings = {d.split()[-1] for d in descriptions[:len(FAMILIES)]}
    assert {"background", "flag", "roof", "centre"} <= endings and endings & {"row", "page"}
    assert generate(300, seed=1) != scenes


def test_generated_references_pass_and_a_blank_page_does_not() -> None:
    task = make_task(train_pictures=120, image_baseline="region")
    assert len(task.train_rows) == 40 + 120
    assert [r["description"] for r in task.eval_rows] == [r["description"] for r in make_task().eval_rows]
    for row in task.train_rows[40:]:
        assert row["description"] in row["prompt"][1]["content"]
        ref = score_completion(task, row, row["reference"])
        assert ref.passed and ref.components["drawing_image"] == pytest.approx(1.0), row["description"]
        assert not score_completion(task, row, 'fill("white")').passed
        (demo,) = task.demonstrate(row)
        assert demo == row["reference"]
    drain_task_metrics(task)


@pytest.mark.parametrize("bad", [-1, 2.5, True, "400"])
def test_bad_train_pictures_are_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="train_pictures"):
        make_task(train_pictures=bad)  # type: ignore[arg-type]


def test_asking_for_more_pictures_than_the_families_hold_is_an_error() -> None:
    from posttrain.tasks.drawing_scenes import generate

    with pytest.raises(ValueError, match="ran out"):
        generate(100_000)


def test_eval_pictures_swap_in_generated_pictures_never_trained_on() -> None:
    task = make_task(train_pictures=50, eval_pictures=30)
    train = {r["description"] for r in task.train_rows}
    held = [r["description"] for r in task.eval_rows]
    assert len(held) == 30 and not train & set(held)
    assert held == [r["description"] for r in make_task(train_pictures=50, eval_pictures=30).eval_rows]
    with pytest.raises(ValueError, match="eval_pictures"):
        make_task(eval_pictures=-3)
