"""The learning run every vLLM placement is tested with (in process, servers, Ray actors), and what it must show."""

from posttrain.config import load_config
from posttrain.obs import read_metrics


def vllm_learning_config(tmp_path, model_dir, *extra):
    """count-a with the settings of tests/loop/test_rl_loop.py's learning test, on a vLLM-shaped tiny model."""
    return load_config(None, [f"model.name={model_dir}", "model.threads=1", "task.name=count-a",
                              "logging.tensorboard=false", "logging.console=false", "loop.eval_prompts=8",
                              "loop.steps=20", "loop.prompts_per_step=4", "algorithm.num_generations=8",
                              "trainer.lr=3e-3", "loop.save_every=0", "loop.keep_checkpoints=0",
                              f"run.output_dir={tmp_path}", "sampling.engine=vllm", "sampling.vllm.kv_cache_gb=0.25",
                              "diagnostics.remedies.enabled=false",  # the engine under test, not the remedies
                              *extra])


def assert_learned(run_dir, versions=True, check_gap=True):
    """`check_gap`: the sampler's log-probs are the trainer's (a sync loop: what was sampled is what trains; in the
    async loop the trainer has moved on by up to loop.max_staleness versions)."""
    recs = [r for r in read_metrics(str(run_dir)) if r["kind"] == "train"]
    assert len(recs) == 20
    first = sum(r["reward/mean"] for r in recs[:5]) / 5
    last = sum(r["reward/mean"] for r in recs[-5:]) / 5
    assert last > first + 0.3, (first, last)
    gaps = [r["train/sampler_logp_abs_diff"] for r in recs if "train/sampler_logp_abs_diff" in r]
    gaps_max = [r["train/sampler_logp_abs_diff_max"] for r in recs if "train/sampler_logp_abs_diff_max" in r]
    assert gaps and len(gaps_max) == len(gaps)
    if check_gap:
        assert max(gaps) < 1e-4 and max(gaps_max) < 1e-2, (gaps, gaps_max)  # the engine samples what trains
    if versions:
        assert [r["policy_version"] for r in recs] == list(range(1, 21))
    return recs
