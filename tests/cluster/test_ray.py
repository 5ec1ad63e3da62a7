"""cluster.backend=ray: rollouts on Ray sampler actors across two (simulated) nodes, learning, surviving a killed
actor; and the refusals (bad config, Ray missing), which run without Ray installed."""

import asyncio
import subprocess
import sys

import pytest

from posttrain.cluster.ray_runtime import RaySession, RayUnavailable
from posttrain.cluster.ray_sampler import RaySamplerPool, SamplerPoolError, split
from posttrain.cluster.ray_weights import ObjectStoreWeights
from posttrain.config import ConfigError, load_config
from posttrain.loop import train
from posttrain.loop.pg_stepper import PolicyGradientStepper
from posttrain.obs import read_metrics
from posttrain.sampling.context import ContextOverflow
from posttrain.types import SampleParams

FAST = ["model.name=tiny-random", "model.threads=1", "task.name=count-a", "logging.tensorboard=false",
        "logging.console=false", "loop.eval_prompts=8", "loop.save_every=0",
        "diagnostics.remedies.enabled=false"]  # the transport under test, not the remedies (on by default)
RAY = ["cluster.backend=ray", "cluster.address=auto", "cluster.num_samplers=2", "cluster.actor_timeout_s=300"]  # actor start on a loaded 2-core box


def _cfg(tmp_path, *extra):
    return load_config(None, FAST + RAY + [f"run.output_dir={tmp_path}"] + list(extra))


def _train_records(run_dir):
    return [r for r in read_metrics(str(run_dir)) if r["kind"] == "train"]


def test_grpo_on_ray_samplers_on_two_nodes_raises_reward(tmp_path, two_nodes, pools):
    # The settings of tests/loop/test_rl_loop.py's learning test, with rollouts on two actors.
    res = train(_cfg(tmp_path, "loop.steps=30", "loop.prompts_per_step=4", "algorithm.num_generations=8",
                     "trainer.lr=3e-3"))
    (pool,) = pools
    assert len({s.node_id for s in pool.slots}) == 2, [s.node_id for s in pool.slots]  # one actor per node
    recs = _train_records(res.run_dir)
    assert len(recs) == 30
    first = sum(r["reward/mean"] for r in recs[:5]) / 5
    last = sum(r["reward/mean"] for r in recs[-5:]) / 5
    assert last > first + 0.3, (first, last)
    assert all(r["cluster/samplers_alive"] == 2 and r["cluster/actor_restarts"] == 0 for r in recs)
    assert recs[-1]["cluster/weight_mb"] > 0
    assert two_nodes.is_initialized()  # the test started Ray, so the run left it running


def test_killed_sampler_actor_is_replaced_and_the_run_finishes(tmp_path, two_nodes, pools, monkeypatch):
    step, call = PolicyGradientStepper.step, RaySamplerPool._call
    armed, killed = [], []

    async def arm_at_step_3(self, i):
        if i == 2:
            armed.append(True)
        return await step(self, i)

    async def kill_mid_call(self, slot, rows, params):
        """Step 3's share on actor 0: submitted, then the actor is killed while the call is in flight."""
        if not (armed and slot.rank == 0):
            return await call(self, slot, rows, params)
        armed.clear()
        killed.append(slot.handle)
        pending = asyncio.ensure_future(call(self, slot, rows, params))
        await asyncio.sleep(0)  # the call is submitted
        two_nodes.kill(slot.handle)
        return await pending

    monkeypatch.setattr(PolicyGradientStepper, "step", arm_at_step_3)
    monkeypatch.setattr(RaySamplerPool, "_call", kill_mid_call)
    res = train(_cfg(tmp_path, "loop.steps=5", "loop.prompts_per_step=2", "cluster.max_restarts=1"))
    (pool,) = pools
    recs = _train_records(res.run_dir)
    assert [r["step"] for r in recs] == [1, 2, 3, 4, 5]
    assert [r["cluster/actor_restarts"] for r in recs] == [0, 0, 1, 1, 1]
    assert all(r["cluster/samplers_alive"] == 2 for r in recs)
    assert len(killed) == 1 and pool.slots[0].handle is not killed[0] and pool.slots[0].incarnation == 1


def test_pool_checks_versions_and_retires_actors_past_max_restarts(tmp_path, two_nodes, tiny):
    """On a pool driven directly (max_restarts=0): an actor that serves an older policy than the pool pushed (it
    missed a load) is caught by the version on its completions, reloads and samples its share again; the sampler's
    own error is raised, not retried; a dead actor with no replacements left is retired and the other takes its
    share; with none left the call fails with the pool's error."""
    model, tok = tiny
    pool = RaySamplerPool.start(_cfg(tmp_path, "cluster.max_restarts=0", "sampling.max_context=256"), tok)
    sync = ObjectStoreWeights(model, pool)
    params = SampleParams(max_tokens=4, temperature=1.0)
    prompts = [tok(f"say a {i}")["input_ids"] for i in range(4)]
    try:
        sync.push(1)
        v1 = pool._weights[0]
        sync.push(2)
        two_nodes.get(pool.slots[1].handle.load_weights.remote(v1, 1))  # actor 1 falls back to version 1
        out = asyncio.run(pool.sample(prompts, params, n=2))
        assert [len(g) for g in out] == [2, 2, 2, 2]
        assert {c.policy_version for g in out for c in g} == {2}
        assert two_nodes.get(pool.slots[1].handle.ready.remote())["version"] == 2

        with pytest.raises(ValueError, match="empty prompt"):
            asyncio.run(pool.sample([[]], params))

        # Issue #52: a prompt past the actors' context (sampling.max_context) fails its own caller, before the
        # actors see it; the caller coalesced with it is served.
        assert pool.context.max_context == 256

        async def mixed():
            return await asyncio.gather(pool.sample(prompts[:2], params, n=2), pool.sample([[5] * 300], params),
                                        return_exceptions=True)

        short, long_ = asyncio.run(mixed())
        assert [len(g) for g in short] == [2, 2]
        assert isinstance(long_, ContextOverflow) and long_.max_context == 256

        two_nodes.kill(pool.slots[0].handle)
        out = asyncio.run(pool.sample(prompts, params, n=2))
        assert [len(g) for g in out] == [2, 2, 2, 2]
        assert pool.metrics() == {"cluster/actor_restarts": 0.0, "cluster/samplers_alive": 1.0}
        two_nodes.kill(pool.slots[1].handle)
        with pytest.raises(SamplerPoolError, match="every sampler actor is retired"):
            asyncio.run(pool.sample(prompts, params))
    finally:
        sync.close()
    assert two_nodes.is_initialized()  # closing the pool left the caller's Ray running


def test_split_covers_rows_in_order():
    assert split(1, 3) == [(0, 1)]
    for n in range(12):
        for k in range(1, 5):
            spans = split(n, k)
            assert [i for a, b in spans for i in range(a, b)] == list(range(n))


# ---- refusals: no Ray needed -------------------------------------------------------------------------------
@pytest.mark.parametrize("override, match", [
    ("cluster.backend=slurm", "backend"),
    ("cluster.num_samplers=0", "num_samplers"),
    ("cluster.address=10.0.0.1:6379", "address"),
    ("cluster.placement=scatter", "placement"),
])
def test_bad_cluster_settings_are_refused(override, match):
    with pytest.raises(ConfigError, match=match):
        load_config(None, [override])


def test_ray_backend_refuses_es_and_low_precision():
    with pytest.raises(ConfigError, match="algorithm.name=es"):
        load_config(None, ["cluster.backend=ray", "algorithm.name=es"])
    with pytest.raises(ConfigError, match="sampling.precision"):
        load_config(None, ["cluster.backend=ray", "sampling.precision=bf16"])


def test_missing_ray_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(RayUnavailable, match=r"pip install 'posttrain\[ray\]'"):
        RaySession.connect(load_config(None, ["cluster.backend=ray"]).cluster)
    with pytest.raises(RayUnavailable, match=r"pip install 'posttrain\[ray\]'"):  # and from a whole run
        train(_cfg(tmp_path, "loop.steps=1", "loop.eval_before=false", "task.env_check=off"))


def test_local_backend_never_imports_ray():
    code = ("import sys; from posttrain.loop import wiring, run; from posttrain.cluster import ray_sampler; "
            "assert 'ray' not in sys.modules, 'ray imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
