"""loop.final_model=best (loop/best_model.py): final/ is the model of the best held-out eval, and the run says which
step that is; a run whose held-out falls does not ship the worse model."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from posttrain.loop.best_model import BestModel


def _saver(log):
    def save(folder):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "w.txt").write_text(str(len(log)))
        log.append(folder.name)
    return save


def test_the_best_eval_is_kept_ties_go_later_and_final_is_its_copy(tmp_path):
    log: list[str] = []
    best = BestModel("eval/pass_rate", tmp_path / "best")
    save = _saver(log)
    assert best.observe(0, {"eval/pass_rate": 0.125}, save)
    assert not best.observe(5, {"eval/pass_rate": 0.042}, save)  # worse: not saved
    assert best.observe(10, {"eval/pass_rate": 0.125}, save)  # a tie goes to the later step
    assert not best.observe(15, {"eval/reward": 1.0}, save)  # the metric is missing: nothing to compare
    step, note = best.finish(tmp_path / "final", save, last_step=20, use_best=True)
    assert step == 10 and "final/ is step 10" in note and "step 20 scored lower" in note
    assert (tmp_path / "final" / "w.txt").read_text() == (tmp_path / "best" / "w.txt").read_text()
    step, note = best.finish(tmp_path / "final2", save, last_step=20, use_best=False)
    assert step == 20 and note == "final/ is step 20"
    resumed = BestModel("eval/pass_rate", tmp_path / "best")
    resumed.load_state_dict(json.loads(json.dumps(best.state_dict())))
    assert (resumed.step, resumed.value) == (10, 0.125)


def test_a_run_exports_the_best_evals_model_and_says_which_step(tmp_path):
    from posttrain.config import load_config
    from posttrain.loop import train

    cfg = load_config(None, ["model.name=tiny-random", "task.name=count-a", "logging.tensorboard=false",
                             "logging.console=false", "loop.eval_prompts=4", "loop.steps=3", "loop.eval_every=1",
                             "loop.save_every=0", "trainer.lr=3e-3", f"run.output_dir={tmp_path}"])
    res = train(cfg)
    evals = [json.loads(line) for line in (res.run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in evals if r.get("kind") == "eval"]
    top = max(r["eval/pass_rate"] for r in evals)
    expected = max(r["step"] for r in evals if r["eval/pass_rate"] == top)  # ties: the later step
    summary = json.loads((res.run_dir / "summary.json").read_text())
    assert summary["final"]["step"] == expected and summary["final"]["best"]["value"] == top
    final = load_file(str(res.run_dir / "final" / "model.safetensors"))
    best = load_file(str(res.run_dir / "best" / "model.safetensors"))
    assert final.keys() == best.keys() and all(torch.equal(final[k], best[k]) for k in final)


# ---- loop.best_metric names a metric the eval writes (issue 60) ----------------------------------------------------


def test_a_misspelled_best_metric_is_refused_with_the_nearest_name():
    from posttrain.loop.best_model import BestMetricError, check_best_metric, eval_metric_names
    from posttrain.tasks import count_a

    names = eval_metric_names(count_a.make_task(), samples=1)
    assert {"eval/pass_rate", "eval/reward/mean", "eval/reward"} <= names
    for ok in ("eval/pass_rate", "eval/reward/mean", "eval/episode/turns", "eval/judge/agreement"):
        check_best_metric(ok, names)  # written every eval, or a name only the run knows (taken on trust)
    for bad, near in (("eval/pass_rte", "eval/pass_rate"), ("eval/passrate", "eval/pass_rate"),
                      ("pass_rate", "eval/pass_rate"), ("eval/reward_mean", "eval/reward/mean")):
        with pytest.raises(BestMetricError) as e:
            check_best_metric(bad, names)
        assert str(e.value).startswith(f"loop.best_metric {bad!r} is not a metric the held-out eval writes; did you "
                                       f"mean {near!r}?"), str(e.value)
        assert "\n" not in str(e.value) and e.value.fix
    with pytest.raises(BestMetricError, match="held-out metrics are named eval/"):
        check_best_metric("accuracy", names)


def test_the_names_are_the_ones_the_eval_writes(tiny):
    """Drift guard: a held-out eval of count-a (2 samples a prompt) writes exactly the names eval_metric_names
    lists, less the ones written only when a sample fails and the one the Run adds (eval/reward)."""
    from posttrain.envs.single_turn import SingleTurnEnv
    from posttrain.loop.best_model import eval_metric_names
    from posttrain.loop.evaluate import evaluate
    from posttrain.sampling.scripted import ScriptedSampler
    from posttrain.tasks import count_a
    from posttrain.types import SampleParams

    _, tok = tiny
    task = count_a.make_task()
    params = SampleParams(max_tokens=8, temperature=1.0)
    m, _ = evaluate(SingleTurnEnv(task, tok, params), ScriptedSampler(tok, ["a a", "b"]), task.eval_rows[:2],
                    params, samples=2)
    names = eval_metric_names(task, samples=2)
    assert set(m) <= names, set(m) - names
    only_on_failure = {"eval/rollout/failed_rollout", "eval/rollout/failed_score", "eval/rollout/failed_frac"}
    assert names - set(m) == only_on_failure | {"eval/reward"}


def test_a_best_metric_no_eval_wrote_is_said_not_silent(tmp_path):
    said: list[str] = []
    best = BestModel("eval/judge/score", tmp_path / "best", say=said.append)
    save = _saver([])
    assert not best.observe(0, {"eval/pass_rate": 0.5}, save)
    assert not best.observe(1, {"eval/pass_rate": 0.6}, save)
    assert len(said) == 1 and said[0].startswith("warning: loop.best_metric 'eval/judge/score' is not in this "
                                                 "held-out eval's metrics")
    _, note = best.finish(tmp_path / "final", save, last_step=2, use_best=True)
    assert note == "final/ is step 2 (loop.best_metric 'eval/judge/score' was in no held-out eval: the last step)"


def test_a_run_refuses_a_misspelled_best_metric_at_its_start(tmp_path):
    from posttrain.config import load_config
    from posttrain.loop import Run
    from posttrain.loop.best_model import BestMetricError

    cfg = load_config(None, ["model.name=tiny-random", "task.name=count-a", "logging.console=false",
                             "loop.best_metric=eval/pass_rte", f"run.output_dir={tmp_path}"])
    with pytest.raises(BestMetricError, match="did you mean 'eval/pass_rate'"):
        Run(cfg)
