"""loop.final_model=best (loop/best_model.py): final/ is the model of the best held-out eval, and the run says which
step that is; a run whose held-out falls does not ship the worse model."""

from __future__ import annotations

import json

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
