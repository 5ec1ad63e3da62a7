"""Issue #60: a vLLM server a pool starts (cluster/vllm_servers.py) is reachable by that pool alone. Another local
process tries what it could when the server listened on 127.0.0.1: it finds the server's ports as `ss -ltnp` would
and posts `/collective_rpc` `reload_weights` from a folder of its own (forged weights) to each; as another user it
connects to each Unix socket the server listens on. It reaches nothing, the server keeps serving what the pool
pushed, and the pool still pushes and samples. One real vLLM CPU server, nothing of vLLM mocked (a start costs
about a minute on two shared cores: slow-marked)."""

from __future__ import annotations

import asyncio
import importlib.util
import os
from pathlib import Path

import pytest
import torch
from server_intruder import other_user_connects, reaches_over_tcp, tcp_listeners, unix_listeners

from posttrain.types import SampleParams

pytestmark = [pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed"),
              pytest.mark.slow, pytest.mark.xdist_group("vllm")]

PROMPTS = [[5, 6, 7, 8, 9], [10, 11, 12]]
GREEDY = SampleParams(max_tokens=8, temperature=0.0)


def _tokens(pool) -> list[list[int]]:
    return [c.token_ids for g in asyncio.run(pool.sample(PROMPTS, GREEDY)) for c in g]


def test_no_other_process_reaches_a_pool_server_and_the_pool_still_pushes_and_samples(tmp_path):
    from safetensors.torch import save_file

    from posttrain.cluster.vllm_servers import VLLMServerPool
    from posttrain.models.tiny import tiny_random_model
    from posttrain.sampling.vllm_engine import EngineSpec
    from posttrain.sampling.vllm_weights import hf_state

    torch.set_num_threads(1)
    model, tok = tiny_random_model(hidden_size=128)  # head size 32, which the CPU attention supports
    model.save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    orig = {n: t.clone() for n, t in hf_state(model).items()}
    g = torch.Generator().manual_seed(0)
    noisy = {n: t + 0.3 * torch.randn(t.shape, generator=g) for n, t in orig.items()}
    noisy["lm_head.weight"] = noisy["model.embed_tokens.weight"].clone()  # tied in the tiny model
    forged = tmp_path / "forged"  # the intruder's own folder of weights
    forged.mkdir()
    save_file({n: t.contiguous() for n, t in noisy.items()}, str(forged / "model.safetensors"))

    spec = EngineSpec(model_dir=str(tmp_path / "model"), dtype="float32", max_model_len=256, kv_cache_gb=0.125)
    pool = VLLMServerPool.start(spec, tok, [tok.eos_token_id], num_servers=1, work_dir=tmp_path / "work",
                                timeout_s=120, start_timeout_s=400, max_restarts=1, env={"OMP_NUM_THREADS": "1"})
    try:
        server = pool.slots[0].server
        before = _tokens(pool)
        # 1. Over TCP: the server's process group listens on no port that speaks HTTP.
        listeners = tcp_listeners(server.pgid)
        body = {"method": "reload_weights", "timeout": 60, "kwargs": {"weights_path": str(forged)}}
        assert reaches_over_tcp(listeners, "/collective_rpc", body) == [], listeners
        # what TCP remains is vLLM's own gloo groups (world size 1, never paired), on loopback alone
        assert all(addr in ("127.0.0.1", "::1") for addr, _ in listeners), listeners
        # 2. Unix sockets: every one in the pool's private directory, none open to another user.
        private = pool.sockets.path
        paths = unix_listeners(server.pgid)
        assert str(server.socket) in paths and all(Path(p).parent == private for p in paths), paths
        for p in paths:
            assert other_user_connects(p) in ((None,) if os.geteuid() else (False,)), p
        # 3. The server still serves what the pool pushed (the forged weights never loaded) ...
        assert _tokens(pool) == before
        # ... and the pool pushes and samples over its socket.
        v0 = pool.policy_version
        pool.push(noisy, v0 + 1)
        got = asyncio.run(pool.sample(PROMPTS, GREEDY))
        assert {v for gr in got for c in gr for v in c.token_versions} == {v0 + 1}
        assert [c.token_ids for gr in got for c in gr] != before
        pool.push(orig, v0 + 2)
        assert _tokens(pool) == before
    finally:
        pool.close()
    assert not pool.sockets.path.exists()
