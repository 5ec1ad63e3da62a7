"""The report's per-token trainer log-probs (samples.jsonl `token_trainer_logprobs`): taken from the update's own
first forward pass, before the update, with no extra forward pass for rows the update trains on."""

import json

import pytest

from posttrain.config import load_config
from posttrain.loop import train
from posttrain.loop.pg_stepper import PolicyGradientStepper

FAST = ["model.name=tiny-random", "task.name=count-a", "logging.tensorboard=false", "logging.console=false",
        "loop.eval_prompts=4", "loop.save_every=0", "loop.eval_before=false", "trainer.lr=1e-2",
        "loop.prompt_selection=uniform"]  # the draw this test was written against (a shown row gets trained)


@pytest.mark.parametrize("num_iterations", [1, 2])
def test_shown_rows_carry_the_pre_update_logprobs_without_an_extra_pass(tmp_path, monkeypatch, num_iterations):
    before, extra_passes, shown_in_update = {}, [], []
    orig_opt, orig_stats = PolicyGradientStepper._optimize, PolicyGradientStepper._token_stats

    def optimize(self, batch):
        # the reference: the policy's log-probs of every trained row, computed separately before the update
        before.update({s.sample_id: lp for s, lp in zip(batch.sequences, self.trainer.compute_logprobs(batch),
                                                        strict=True)})
        m, trained = orig_opt(self, batch)
        for s in trained.sequences:  # what the update kept is the pre-update value, not a later pass's ...
            if s.capture_logprobs:
                assert s.trainer_logprobs == pytest.approx(before[s.sample_id], abs=1e-5)
            else:  # ... and only for the rows the report shows
                assert s.trainer_logprobs is None
        return m, trained

    def token_stats(self, shown, batch):
        real = self.trainer.compute_logprobs
        self.trainer.compute_logprobs = lambda b, *a, **k: extra_passes.append(len(b.sequences)) or real(b, *a, **k)
        try:
            marked = orig_stats(self, shown, batch)
        finally:
            self.trainer.compute_logprobs = real
        captured = [s for s in marked.sequences if s.capture_logprobs]
        assert {s.sample_id for s in captured} <= {t.sample_id for t in shown}  # only shown rows are marked
        assert [s.sample_id for s in marked.sequences] == [s.sample_id for s in batch.sequences]  # nothing else moved
        shown_in_update.append(len(captured))
        return marked

    monkeypatch.setattr(PolicyGradientStepper, "_optimize", optimize)
    monkeypatch.setattr(PolicyGradientStepper, "_token_stats", token_stats)
    cfg = load_config(None, FAST + [f"run.output_dir={tmp_path}", "loop.steps=4", "loop.samples_per_step=3",
                                    f"loop.num_iterations={num_iterations}", "algorithm.num_generations=4"])
    res = train(cfg)
    assert sum(shown_in_update) > 0, "no shown row was trained on: the test proves nothing"
    # an extra pass only for shown rows outside the update (zero-advantage groups), never for the captured ones
    assert sum(extra_passes) == 4 * 3 - sum(shown_in_update)
    rows = [json.loads(line) for line in (res.run_dir / "samples.jsonl").read_text().splitlines()]
    rows = [r for r in rows if not r.get("eval")]
    assert len(rows) == 12
    for r in rows:
        assert len(r["token_trainer_logprobs"]) == r["tokens"]
        # fp32 sampler and trainer on the same weights: the two agree up to kernel rounding
        assert r["token_trainer_logprobs"] == pytest.approx(r["token_logprobs"], abs=2e-3)
