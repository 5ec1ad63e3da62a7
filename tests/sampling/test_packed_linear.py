"""oneDNN-packed Linear layers for the sampler's own copy: equal to F.linear, re-packed exactly at each sync,
never applied where the CPU cannot pack or to a model with adapters, and chosen by sampling.packed_weights."""

import pytest
import torch

from posttrain.config import load_config
from posttrain.sampling import packed_linear
from posttrain.sampling.packed_linear import PackedLinear, can_pack, pack_linears_

TOL = {torch.float32: 1e-5, torch.bfloat16: 3e-2}  # bf16: relative to the output's scale


def _dtypes():
    return [pytest.param(d, marks=pytest.mark.skipif(not can_pack(d), reason=f"oneDNN cannot pack {d} here"))
            for d in (torch.float32, torch.bfloat16)]


@pytest.mark.parametrize("dtype", _dtypes())
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(1, 48), (5, 48), (16, 48), (300, 48), (2, 7, 48)])
def test_packed_linear_equals_f_linear(dtype, bias, shape):
    g = torch.Generator().manual_seed(0)
    lin = torch.nn.Linear(48, 40, bias=bias)
    x = torch.randn(*shape, generator=g)
    ref = torch.nn.functional.linear(x, lin.weight.to(dtype).float(), None if lin.bias is None else lin.bias.to(dtype).float())
    y = PackedLinear(lin, dtype)(x)
    assert y.shape == ref.shape and y.dtype == x.dtype
    assert (y - ref).abs().max() <= TOL[dtype] * max(ref.abs().max().item(), 1.0)


@pytest.mark.parametrize("dtype", _dtypes())
def test_load_repacks_and_refuses_a_wrong_shape(dtype):
    lin = torch.nn.Linear(16, 8)
    p = PackedLinear(lin, dtype)
    x = torch.randn(3, 16)
    with torch.no_grad():
        lin.weight.mul_(-2.0)
    p.load_(lin.weight, lin.bias)
    ref = torch.nn.functional.linear(x, lin.weight.to(dtype).float(), lin.bias.to(dtype).float())
    assert (p(x) - ref).abs().max() <= TOL[dtype] * max(ref.abs().max().item(), 1.0)
    with pytest.raises(ValueError, match="weight of shape"):
        p.load_(torch.zeros(16, 8), None)


@pytest.mark.skipif(not can_pack(torch.float32), reason="oneDNN cannot pack fp32 here")
def test_pack_linears_packs_every_plain_linear_and_keeps_the_logits(tiny):
    import copy

    model, _ = tiny
    m = copy.deepcopy(model).eval()
    n_linear = sum(type(x) is torch.nn.Linear for x in m.modules())
    x = torch.randint(3, 100, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = model(x).logits
        assert pack_linears_(m, torch.float32) == n_linear > 0
        out = m(x).logits
    assert not any(type(x) is torch.nn.Linear for x in m.modules())
    assert (out - ref).abs().max() < 1e-4


def test_nothing_is_packed_where_the_cpu_cannot(tiny, monkeypatch):
    import copy

    model, _ = tiny
    m = copy.deepcopy(model)
    monkeypatch.setattr(packed_linear, "can_pack", lambda dtype: False)
    assert pack_linears_(m, torch.float32) == 0
    assert not any(isinstance(x, PackedLinear) for x in m.modules())


def test_a_model_with_adapters_is_refused(tiny):
    import copy

    from posttrain.models.lora import apply_lora

    lora = apply_lora(copy.deepcopy(tiny[0]), r=4, alpha=8.0, dropout=0.0, target_modules=["q_proj"])
    with pytest.raises(ValueError, match="merge"):
        pack_linears_(lora, torch.float32)


@pytest.mark.skipif(not can_pack(torch.float32), reason="oneDNN cannot pack fp32 here")
@pytest.mark.parametrize("overrides,packed,sync_name", [
    ([], False, "SharedWeights"),                                       # auto, sync loop, fp32: shares the policy
    (["sampling.packed_weights=on"], True, "LowPrecisionCopy"),         # its own packed fp32 copy
    (["sampling.packed_weights=off", "sampling.precision=bf16"], False, "LowPrecisionCopy"),
    (["sampling.precision=int8", "sampling.packed_weights=on"], False, "LowPrecisionCopy"),  # int8: own kernel
    (["lora.enabled=true"], False, "SharedWeights"),
    (["lora.enabled=true", "sampling.packed_weights=on"], True, "LowPrecisionCopy"),  # merged, then packed
])
def test_the_config_chooses_the_rollout_samplers_weights(tmp_path, overrides, packed, sync_name):
    from posttrain.loop.components import build
    from posttrain.loop.wiring import local_rollout_sampler

    cfg = load_config(None, ["model.name=tiny-random", "task.name=count-a", "logging.tensorboard=false",
                             "logging.console=false", f"run.output_dir={tmp_path}", *overrides])
    c = build(cfg)
    sampler, sync = local_rollout_sampler(cfg, c, own_copy=False)
    assert type(sync).__name__ == sync_name
    assert any(isinstance(m, PackedLinear) for m in sampler.model.modules()) == packed
    if packed:  # a sync re-packs the trainer's new weights: the copy then samples what the policy would
        with torch.no_grad():
            for p in c.model.parameters():
                p.mul_(1.05)
        sync.push(1)
        x = torch.randint(3, 100, (2, 9), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            assert (sampler.model(x).logits - c.model(x).logits).abs().max() < 1e-4
        assert sampler.policy_version == 1


@pytest.mark.skipif(not can_pack(torch.float32), reason="oneDNN cannot pack fp32 here")
@pytest.mark.parametrize("lora,packed,sync_name", [(False, True, "LowPrecisionCopy"), (True, False, "CopyWeights")])
def test_the_async_loops_fp32_copy_is_packed_unless_it_has_adapters(tmp_path, lora, packed, sync_name):
    from posttrain.loop.components import build
    from posttrain.loop.wiring import local_rollout_sampler

    cfg = load_config(None, ["model.name=tiny-random", "task.name=count-a", "logging.tensorboard=false",
                             "logging.console=false", f"run.output_dir={tmp_path}", f"lora.enabled={lora}"])
    sampler, sync = local_rollout_sampler(cfg, build(cfg), own_copy=True)
    assert type(sync).__name__ == sync_name
    assert any(isinstance(m, PackedLinear) for m in sampler.model.modules()) == packed


def test_should_pack_follows_the_setting(tiny, monkeypatch):
    import copy

    from posttrain.models.lora import apply_lora
    from posttrain.sampling import precision
    from posttrain.sampling.precision import should_pack

    model = tiny[0]
    lora = apply_lora(copy.deepcopy(model), r=4, alpha=8.0, dropout=0.0, target_modules=["q_proj"])
    monkeypatch.setattr(precision, "can_pack", lambda dtype: True)
    assert should_pack(model, "bf16", "auto", holds_copy=True)
    assert not should_pack(model, "fp32", "auto", holds_copy=False)  # the sync loop's shared sampler stays shared
    assert should_pack(model, "fp32", "on", holds_copy=False)
    assert not should_pack(lora, "fp32", "auto", holds_copy=True)  # an adapter-only sync beats a merge per sync
    assert should_pack(lora, "fp32", "on", holds_copy=True)
    assert not should_pack(model, "int8", "on", holds_copy=True)  # its own kernel
    assert not should_pack(model, "bf16", "off", holds_copy=True)
    monkeypatch.setattr(precision, "can_pack", lambda dtype: False)
    assert not should_pack(model, "bf16", "auto", holds_copy=True)
    with pytest.raises(ValueError, match="cannot pack bf16"):
        should_pack(model, "bf16", "on", holds_copy=True)
