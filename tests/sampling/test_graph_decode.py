"""The GPU decode fast path's loop (static cache, bucketed batch, no compaction), run uncompiled on the CPU, draws
the same tokens with the same log-probs as the eager loop: same weights, same generator state, same prompts."""

import torch

from posttrain.models import stop_token_ids
from posttrain.models.tiny import tiny_random_model
from posttrain.sampling import HFSampler
from posttrain.sampling.graph_decode import batch_bucket, capacity_bucket
from posttrain.types import SampleParams


def _pair():
    model, tok = tiny_random_model(seed=0)
    model.eval()
    eager = HFSampler(model, tok, stop_token_ids(model, tok), seed=7)
    static = HFSampler(model, tok, stop_token_ids(model, tok), seed=7, graphs=True)
    return eager, static, tok


def test_buckets():
    assert [batch_bucket(n) for n in (1, 2, 3, 5, 64, 65)] == [1, 2, 4, 8, 64, 128]
    assert capacity_bucket(1) == 128 and capacity_bucket(128) == 128 and capacity_bucket(129) == 256


def test_static_loop_matches_the_eager_loop_token_for_token():
    eager, static, tok = _pair()
    # prompts of different lengths (left padding), shared prompts (the eager loop prefills them once), 3 rows: a
    # batch bucket of 4 with one padding row
    prompts = [tok.encode("hello there"), tok.encode("hi")]
    for params in (SampleParams(max_tokens=12, temperature=1.0), SampleParams(max_tokens=9, temperature=0.7, top_k=5),
                   SampleParams(max_tokens=10, temperature=0.0)):
        a = eager.sample_sync(prompts, params, n=3)
        b = static.sample_sync(prompts, params, n=3)
        for ga, gb in zip(a, b):
            for ca, cb in zip(ga, gb):
                assert ca.token_ids == cb.token_ids
                assert ca.finish_reason == cb.finish_reason
                assert torch.allclose(torch.tensor(ca.logprobs), torch.tensor(cb.logprobs), atol=1e-5)


def test_static_loop_stops_rows_and_reuses_its_cache():
    eager, static, tok = _pair()
    params = SampleParams(max_tokens=20, temperature=1.0, stop=["a"])  # a stop string most rows hit early
    p = [tok.encode("abc")]
    a, b = eager.sample_sync(p, params, n=5), static.sample_sync(p, params, n=5)
    assert [c.token_ids for c in a[0]] == [c.token_ids for c in b[0]]
    assert [c.finish_reason for c in a[0]] == [c.finish_reason for c in b[0]]
    dec = static._graph_decoder
    assert len(dec._caches) == 1
    static.sample_sync(p, params, n=5)  # same buckets: the cache is reset and reused, not reallocated
    assert len(dec._caches) == 1
