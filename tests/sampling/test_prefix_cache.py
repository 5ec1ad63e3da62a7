"""The multi-turn prefix cache (sampling/prefix_cache.py): the next turn prefills only its new tokens, and what it
samples is what a fresh prefill would have sampled."""

import asyncio

import pytest
import torch

from posttrain.models import render_prompt, stop_token_ids
from posttrain.sampling import HFSampler
from posttrain.sampling.prefix_cache import PrefixStore
from posttrain.types import SampleParams

GREEDY = SampleParams(max_tokens=12, temperature=0.0, keep_prefix=True)


def _forward_logprobs(model, prompt, completion):
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + completion])).logits[0].float()
    lp = logits.log_softmax(-1)[len(prompt) - 1 : -1]
    return lp.gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)


def _episodes(sampler, tok, turns: int, params=GREEDY, newcomer_at: int | None = None):
    """Three episodes of different lengths, each turn's prompt = the last prompt + completion + an env reply;
    `newcomer_at`: a fresh episode joins the batch at that turn (a miss beside the hits)."""
    prompts = [render_prompt(tok, [{"role": "user", "content": t}]) for t in ("hello there", "hi", "a b c d e f")]
    reply = tok("\nok, go on\n", add_special_tokens=False)["input_ids"]
    seen = []
    for k in range(turns):
        if k == newcomer_at:
            prompts.append(render_prompt(tok, [{"role": "user", "content": "new"}]))
        out = sampler.sample_sync(prompts, params)
        seen.append([(p, c[0].token_ids, c[0].logprobs) for p, c in zip(prompts, out)])
        prompts = [p + c[0].token_ids + reply for p, c in zip(prompts, out)]
    return seen


def test_reused_prefixes_sample_what_a_fresh_prefill_samples(tiny):
    model, tok = tiny
    stops = stop_token_ids(model, tok)
    cached = HFSampler(model, tok, stops, prefix_cache_tokens=100_000)
    fresh = HFSampler(model, tok, stops)
    a = _episodes(cached, tok, 4, newcomer_at=2)
    b = _episodes(fresh, tok, 4, newcomer_at=2)
    assert [[(p, c) for p, c, _ in turn] for turn in a] == [[(p, c) for p, c, _ in turn] for turn in b]
    worst = 0.0
    for turn in a:
        for p, c, lp in turn:
            worst = max(worst, (_forward_logprobs(model, p, c) - torch.tensor(lp)).abs().max().item())
    assert worst <= 1e-4
    m = cached.drain_metrics()
    # turn 1: 3 misses; turns 2-4: the 3 episodes hit, the newcomer misses at turn 3 and hits at turn 4
    assert m["sampling/prefix_hits"] == 3 + 3 + 4 and m["sampling/prefix_misses"] == 3 + 1
    assert m["sampling/prefix_reused_tokens"] > m["sampling/prefill_tokens"]
    assert cached.drain_metrics() == {} and fresh.drain_metrics() == {}


def test_only_rows_asked_to_be_kept_are_stored(tiny):
    model, tok = tiny
    s = HFSampler(model, tok, stop_token_ids(model, tok), prefix_cache_tokens=100_000)
    p = render_prompt(tok, [{"role": "user", "content": "hello"}])
    s.sample_sync([p], SampleParams(max_tokens=6, temperature=0.0))
    assert len(s.prefix) == 0
    (c,), = s.sample_sync([p], SampleParams(max_tokens=6, temperature=0.0, keep_prefix=True))
    assert len(s.prefix) == 1 and s.prefix.tokens == len(p) + len(c.token_ids) - 1  # the last token is never fed


def test_any_weight_change_voids_the_store(tiny):
    model, tok = tiny
    s = HFSampler(model, tok, stop_token_ids(model, tok), prefix_cache_tokens=100_000)
    p = render_prompt(tok, [{"role": "user", "content": "hello"}])
    reply = tok("\nok\n", add_special_tokens=False)["input_ids"]
    (c,), = s.sample_sync([p], GREEDY)
    nxt = p + c.token_ids + reply
    s.drain_metrics()
    # An optimizer-style in-place write to a trained parameter, with no version bump: the stored KV is stale.
    w = next(model.parameters())
    with torch.no_grad():
        w.add_(0.05)
    try:
        (c2,), = s.sample_sync([nxt], GREEDY)
        m = s.drain_metrics()
        assert m["sampling/prefix_hits"] == 0 and m["sampling/prefix_misses"] == 1
        ref = _forward_logprobs(model, nxt, c2.token_ids)
        assert (ref - torch.tensor(c2.logprobs)).abs().max().item() <= 1e-4
        # A weight sync through the sampler clears it too, and so does a new policy version.
        assert len(s.prefix) == 1
        s.update_weights(lambda m: None, version=s.policy_version + 1)
        assert len(s.prefix) == 0
        s.sample_sync([nxt], GREEDY)
        s.policy_version += 1
        s.sample_sync([nxt + c2.token_ids + reply], GREEDY)
        assert s.drain_metrics()["sampling/prefix_hits"] == 0
    finally:
        with torch.no_grad():
            w.sub_(0.05)


def test_store_is_bounded_and_keeps_only_the_longest_of_a_chain():
    kv = [(torch.zeros(1, 1, 1, 1), torch.zeros(1, 1, 1, 1))]
    st = PrefixStore(max_tokens=10)
    st.put((1, 2, 3), kv)
    st.put((1, 2, 3, 4, 5), kv)  # extends the first: it replaces it
    assert len(st) == 1 and st.tokens == 5
    assert st.lookup([1, 2, 3, 4, 5, 6])[0] == 5 and st.lookup([1, 2, 3, 4, 5]) is None  # strict prefixes only
    st.put((7, 8, 9, 10), kv)
    st.put((11, 12, 13), kv)  # 12 tokens > 10: the least recently used goes
    assert st.tokens <= 10 and st.lookup([1, 2, 3, 4, 5, 6]) is None and st.lookup([11, 12, 13, 0])[0] == 3
    st.put(tuple(range(100, 120)), kv)  # longer than the whole store: not kept
    assert st.lookup(list(range(100, 121))) is None
    with pytest.raises(ValueError):
        PrefixStore(0)


def test_multi_turn_env_reuses_its_history(tiny):
    """A reversal episode through the Gymnasium text adapter: same greedy episode with and without the cache,
    and every turn after the first hits."""
    from posttrain.envs.base import make_env
    from posttrain.tasks.load import load_task

    model, tok = tiny
    task = load_task("reversal", {"size": 4, "max_turns": 4, "rho": 1.0})
    params = SampleParams(max_tokens=4, temperature=0.0)
    env = make_env(task, tok, params)
    stops = stop_token_ids(model, tok)
    cached = HFSampler(model, tok, stops, prefix_cache_tokens=100_000)
    rows = task.train_rows[:2]

    async def play(s):
        return await asyncio.gather(*(env.rollout(r, s, params) for r in rows))

    a, b = asyncio.run(play(cached)), asyncio.run(play(HFSampler(model, tok, stops)))
    assert [t.sequence()[0] for t in a] == [t.sequence()[0] for t in b]
    turns = sum(len(t.turns) for t in a)
    assert turns > 2 and cached.drain_metrics()["sampling/prefix_hits"] == turns - len(rows)


def test_a_sync_inside_a_kept_call_leaves_nothing_stale(tiny):
    """Interruptible sampler: a weight sync lands mid-generation of a call that keeps its rows. Its KV mixes two
    weight versions, so nothing of it may be reused: the next turn prefills from scratch and matches a fresh
    forward pass under the new weights."""
    import copy

    from tests.sampling.test_interruptible import _other_weights, _sync_at_step

    model, tok = tiny
    s = HFSampler(copy.deepcopy(model).eval(), tok, stop_token_ids=[-1], interruptible=True,
                  prefix_cache_tokens=100_000)
    prompt = [1, 2, 3]
    done = _sync_at_step(s, 4, _other_weights(model), version=7)
    (c,) = s._sample_rows([prompt], SampleParams(max_tokens=8, temperature=0.0, keep_prefix=True))
    done["thread"].join(5)
    s.model.forward = type(s.model).forward.__get__(s.model)
    assert s.policy_version == 7 and len(s.prefix) == 0
    nxt = prompt + c.token_ids + [5, 6]
    (c2,) = s._sample_rows([nxt], SampleParams(max_tokens=6, temperature=0.0, keep_prefix=True))
    assert s.drain_metrics()["sampling/prefix_hits"] == 0
    ref = _forward_logprobs(s.model, nxt, c2.token_ids)
    assert (ref - torch.tensor(c2.logprobs)).abs().max().item() <= 1e-4
