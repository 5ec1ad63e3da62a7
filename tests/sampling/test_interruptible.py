"""Interruptible generation: a weight sync lands between two decode steps of a generation in flight; tokens
record the policy version they were sampled under, and tokens after the sync come from the new weights."""

import copy
import threading
import time

import pytest
import torch

from posttrain.loop.staleness import token_staleness_metrics
from posttrain.sampling.hf_sampler import HFSampler
from posttrain.sampling.kv_cache import cache_arg_name
from posttrain.sampling.weight_gate import WeightGate
from posttrain.types import SampleParams, Trajectory, Turn

PARAMS = SampleParams(max_tokens=12, temperature=1.0, seed=3)


def _sync_at_step(sampler, step: int, state, version: int):
    """Wrap the sampler model's forward: at forward pass `step`, start a weight sync from another thread and let
    the pass finish only once the sync is waiting at the gate (so it lands right after this pass)."""
    model, orig = sampler.model, sampler.model.forward
    calls, done = {"n": 0}, {}

    def forward(*a, **kw):
        calls["n"] += 1
        if calls["n"] == step:
            done["thread"] = threading.Thread(target=sampler.load_weights, args=(state, version))
            done["thread"].start()
            deadline = time.monotonic() + 10
            while sampler._gate.writers_waiting == 0:
                assert time.monotonic() < deadline, "the sync never reached the gate"
                time.sleep(0.001)
        return orig(*a, **kw)

    model.forward = forward
    return done


def _other_weights(model):
    other = copy.deepcopy(model)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    return {n: p.detach() for n, p in other.named_parameters()}


def test_a_sync_lands_mid_generation_and_tokens_carry_their_versions(tiny):
    model, tok = tiny
    sampler = HFSampler(copy.deepcopy(model).eval(), tok, stop_token_ids=[-1], interruptible=True)
    new = _other_weights(model)
    done = _sync_at_step(sampler, 4, new, version=7)  # the prefill is pass 1: tokens 0..3 come from version 0
    (c,) = sampler._sample_rows([[1, 2, 3]], PARAMS)
    done["thread"].join(5)
    assert c.token_versions == [0] * 4 + [7] * 8
    assert c.policy_version == 0  # the completion's version is its oldest token's
    assert sampler.policy_version == 7

    # Token 3 came from the old weights; token 4 from the new weights reading the KV cache the old weights wrote
    # for the tokens before (the cache is kept, not recomputed): replay exactly that and compare log-probs.
    sampler.model.forward = type(sampler.model).forward.__get__(sampler.model)
    ids = torch.tensor([[1, 2, 3] + c.token_ids])
    with torch.no_grad():
        lp_old = torch.log_softmax(model(ids).logits[0].float(), -1)
        past = model(ids[:, :6], use_cache=True).past_key_values  # prompt + tokens 0..2, by the old weights
        mixed = torch.log_softmax(sampler.model(ids[:, 6:7], **{cache_arg_name(model): past}).logits[0, -1].float(), -1)
    assert c.logprobs[3] == pytest.approx(lp_old[5, c.token_ids[3]].item(), abs=1e-4)
    assert c.logprobs[4] == pytest.approx(mixed[c.token_ids[4]].item(), abs=1e-4)
    assert c.logprobs[4] != pytest.approx(lp_old[6, c.token_ids[4]].item(), abs=1e-2)


def test_without_interruption_a_sync_waits_for_the_whole_generation(tiny):
    model, tok = tiny
    sampler = HFSampler(copy.deepcopy(model).eval(), tok, stop_token_ids=[-1], interruptible=False)
    new = _other_weights(model)
    started = threading.Event()
    orig = sampler.model.forward
    landed = {}

    def forward(*a, **kw):
        if not started.is_set():
            started.set()
            t = threading.Thread(target=lambda: (sampler.load_weights(new, 1), landed.setdefault("t", time.monotonic())))
            t.start()
            landed["thread"] = t
            time.sleep(0.05)  # the sync is waiting now; a whole-call gate keeps it out until the call ends
        return orig(*a, **kw)

    sampler.model.forward = forward
    (c,) = sampler._sample_rows([[1, 2, 3]], PARAMS)
    ended = time.monotonic()
    landed["thread"].join(5)
    assert c.token_versions == [0] * 12 and c.policy_version == 0
    assert landed["t"] >= ended - 0.01 and sampler.policy_version == 1


def test_interruptible_sampler_without_syncs_samples_what_the_plain_one_does(tiny):
    model, tok = tiny
    a = HFSampler(model, tok, stop_token_ids=[-1], interruptible=True)
    b = HFSampler(model, tok, stop_token_ids=[-1], interruptible=False)
    ca = a._sample_rows([[1, 2, 3], [4, 5]], PARAMS)
    cb = b._sample_rows([[1, 2, 3], [4, 5]], PARAMS)
    assert [c.token_ids for c in ca] == [c.token_ids for c in cb]
    assert [c.logprobs for c in ca] == [c.logprobs for c in cb]


def test_writer_preference_a_waiting_write_goes_before_the_next_step():
    gate, order = WeightGate(), []
    stop = threading.Event()

    def decoder():
        while not stop.is_set():
            with gate.read():
                order.append("step")
                time.sleep(0.002)

    t = threading.Thread(target=decoder)
    t.start()
    time.sleep(0.01)
    t0 = time.monotonic()
    with gate.write():
        order.append("write")
    waited = time.monotonic() - t0
    stop.set()
    t.join(5)
    assert "write" in order and waited < 0.5  # one step, not starvation
    i = order.index("write")
    assert order[i - 1] == "step" and order[i + 1:i + 2] == ["step"]


def test_token_staleness_metrics_and_trajectory_versions():
    turn_a = Turn([1], [2, 3, 4], [0.0] * 3, policy_version=2, token_versions=[2, 2, 3])  # interrupted
    turn_b = Turn([1, 2, 3, 4, 9], [5, 6], [0.0] * 2, policy_version=3)
    traj = Trajectory(turns=[turn_a, turn_b])
    assert traj.token_versions() == [2, 2, 3, 3, 3] and traj.policy_version == 2
    between_turns = Trajectory(turns=[Turn([1], [2], [0.0], 3), Turn([1, 2, 7], [8], [0.0], 4)])
    one_version = Trajectory(turns=[Turn([1], [2, 3], [0.0] * 2, 4)])
    m = token_staleness_metrics(4, [traj, between_turns, one_version])
    assert m["async/token_staleness_mean"] == pytest.approx((2 + 2 + 1 + 1 + 1 + 1 + 0 + 0 + 0) / 9)
    assert m["async/mixed_version_frac"] == pytest.approx(2 / 3)
    assert m["async/interrupted_frac"] == pytest.approx(1 / 3)
    assert token_staleness_metrics(4, []) == {}


def test_a_sync_inside_a_merged_lora_decode_leaves_the_base_weights_intact(tiny):
    from posttrain.models.lora import apply_lora

    model, tok = tiny
    policy = apply_lora(copy.deepcopy(model), r=4, alpha=8.0, dropout=0.0, target_modules=["q_proj", "v_proj"])
    sampler = HFSampler(copy.deepcopy(policy).eval(), tok, stop_token_ids=[-1], interruptible=True)
    base_before = {n: p.detach().clone() for n, p in sampler.model.named_parameters() if not p.requires_grad}
    with torch.no_grad():
        for p in policy.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.1)
    adapter = {n: p.detach().clone() for n, p in policy.named_parameters() if p.requires_grad}
    done = _sync_at_step(sampler, 3, adapter, version=1)
    (c,) = sampler._sample_rows([[1, 2, 3]], PARAMS)  # decodes on merged weights; the sync lands mid-call
    done["thread"].join(5)
    assert c.token_versions == [0] * 3 + [1] * 9  # passes 1..3 (tokens 0..2) ran before it
    params = dict(sampler.model.named_parameters())
    for n, want in base_before.items():
        assert torch.allclose(params[n], want, atol=1e-6), n
    for n, want in adapter.items():
        assert torch.equal(params[n], want), n


def test_a_write_that_cannot_get_in_times_out_and_leaves_the_gate_usable():
    gate = WeightGate(timeout_s=0.05)
    with gate.read():  # a decode that never ends
        with pytest.raises(TimeoutError, match="weight write waited"):
            with gate.write():
                pass
        assert gate.writers_waiting == 0  # the failed write left no trace: steps are not blocked by it
    with gate.write():  # and once the decode ends, writes go in
        pass
