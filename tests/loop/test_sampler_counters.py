"""The rollout sampler's own counters (its prefix cache's; vLLM's in the engine tests) reach every training record
and never an eval record: the stepper drains them from the collector's sampler each step, the eval drains its own
(issue #53: the collectors had no `sampler`, so the training records never got them and a sync run's eval records
took them instead)."""

import pytest

from posttrain.config import load_config
from posttrain.loop import train
from posttrain.obs import read_metrics


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_rollout_counters_reach_training_records_and_only_those(tmp_path, mode):
    # reversal: multi-turn episodes, whose later turns reuse the KV of the earlier ones (the own prefix cache)
    res = train(load_config(None, [
        "model.name=tiny-random", "model.threads=1", "task.name=reversal", "task.options.size=4",
        "task.options.max_turns=4", "task.options.rho=1.0", "sampling.max_tokens=4", "loop.steps=3",
        "loop.prompts_per_step=2", "algorithm.num_generations=2", "loop.eval_prompts=2", "loop.eval_every=1",
        "logging.tensorboard=false", "logging.console=false", "loop.save_every=0", f"loop.mode={mode}",
        f"run.output_dir={tmp_path}"]))
    recs = read_metrics(str(res.run_dir))
    trains = [r for r in recs if r["kind"] == "train"]
    evals = [r for r in recs if r["kind"] == "eval"]
    assert len(trains) == 3 and len(evals) == 4
    # Rollouts played multi-turn episodes: their later turns hit the cache. Sync: each step's rollouts are its own;
    # async: rollouts run ahead, so a step's record has what was sampled since the last one (the last step's may
    # have been sampled during the one before).
    hits = [r.get("sampling/prefix_hits", 0) for r in trains]
    assert (all(h > 0 for h in hits) if mode == "sync" else sum(hits) > 0), hits
    assert sum(r.get("sampling/prefix_reused_tokens", 0) for r in trains) > 0
    for r in evals:
        assert not any(k.startswith("sampling/") for k in r)
        # the eval's own: one miss per eval episode (its first turn). Rollout counters leaking in would add the
        # training episodes' misses (2 prompts x G=2 a step) to these.
        if "eval/sampling/prefix_misses" in r:
            assert r["eval/sampling/prefix_misses"] == 2, r
