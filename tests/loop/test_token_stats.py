"""The report's per-token learner log-probs (samples.jsonl `token_learner_logprobs`): taken from the update's own
first forward pass (forward_backward's `keep`, returned in its Update), before the update, with no extra forward
pass for rows the update trains on."""

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
    before, extra_passes, kept_rows = {}, [], []
    orig_opt, orig_outside = PolicyGradientStepper._optimize, PolicyGradientStepper._outside_update

    def optimize(self, batch, keep):
        # the reference: the policy's log-probs of every trained row, computed separately before the update, at
        # this step's temperature (a remedy may have raised it)
        lps = self.trainer.compute_logprobs(batch, temperature=self.settings.temperature)
        before.update({s.sample_id: lp for s, lp in zip(batch.sequences, lps, strict=True)})
        m, kept = orig_opt(self, batch, keep)
        # only the shown rows the update trains on come back ...
        assert set(kept) == {s.sample_id for s in batch.sequences} & set(keep)
        for sid, lp in kept.items():  # ... with the pre-update values, not a later pass's
            assert lp == pytest.approx(before[sid], abs=1e-5)
        kept_rows.append(len(kept))
        return m, kept

    def outside_update(self, shown, batch):
        real = self.trainer.compute_logprobs
        self.trainer.compute_logprobs = lambda b, *a, **k: extra_passes.append(len(b.sequences)) or real(b, *a, **k)
        try:
            out = orig_outside(self, shown, batch)
        finally:
            self.trainer.compute_logprobs = real
        assert set(out) <= {t.sample_id for t in shown}  # only shown rows ...
        assert not set(out) & {s.sample_id for s in batch.sequences}  # ... and never one the update trains on
        return out

    monkeypatch.setattr(PolicyGradientStepper, "_optimize", optimize)
    monkeypatch.setattr(PolicyGradientStepper, "_outside_update", outside_update)
    cfg = load_config(None, FAST + [f"run.output_dir={tmp_path}", "loop.steps=4", "loop.samples_per_step=3",
                                    f"loop.num_iterations={num_iterations}", "algorithm.num_generations=4"])
    res = train(cfg)
    assert sum(kept_rows) > 0, "no shown row was trained on: the test proves nothing"
    # an extra pass only for shown rows outside the update (zero-advantage groups), never for the kept ones
    assert sum(extra_passes) == 4 * 3 - sum(kept_rows)
    rows = [json.loads(line) for line in (res.run_dir / "samples.jsonl").read_text().splitlines()]
    rows = [r for r in rows if not r.get("eval")]
    assert len(rows) == 12
    for r in rows:
        assert len(r["token_learner_logprobs"]) == r["tokens"] and isinstance(r["advantage"], float)
        # fp32 sampler and trainer on the same weights: the two agree up to kernel rounding
        assert r["token_learner_logprobs"] == pytest.approx(r["token_logprobs"], abs=2e-3)
