"""model.cpu_matmul: Linear layers through oneDNN give MKL's outputs and gradients to fp32 rounding, in every
place a Linear is used (plain, LoRA, checkpointed, no-grad decode), and the setting is honoured or refused."""

import copy

import pytest
import torch

from posttrain.config import load_config
from posttrain.models import matmul
from posttrain.models.matmul import CPULinear, DecodeOneDNNLinear, OneDNNLinear, onednn_works, route_linears_

needs_onednn = pytest.mark.skipif(not onednn_works(), reason="oneDNN's inner product does not run here")
X = torch.randint(3, 100, (2, 12), generator=torch.Generator().manual_seed(0))


@needs_onednn
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(1, 24), (7, 24), (3, 5, 24)])
def test_onednn_linear_matches_f_linear_with_gradients(bias, shape):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(*shape, generator=g, requires_grad=True)
    w = torch.randn(16, 24, generator=g, requires_grad=True)
    b = torch.randn(16, generator=g, requires_grad=True) if bias else None
    upstream = torch.randn(*shape[:-1], 16, generator=g)
    grads = []
    for f in (torch.nn.functional.linear, OneDNNLinear.apply):
        y = f(x, w, b)
        (y * upstream).sum().backward()
        grads.append((y.detach(), x.grad.clone(), w.grad.clone(), None if b is None else b.grad.clone()))
        for t in (x, w, b):
            if t is not None:
                t.grad = None
    for ref, got in zip(grads[0], grads[1]):
        if ref is not None:
            torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


@needs_onednn
def test_routed_model_trains_like_the_mkl_one(tiny):
    """Same loss and gradients (to fp32 rounding) on the tiny model, full fine-tuning and LoRA."""
    from posttrain.models.lora import apply_lora

    for lora in (False, True):
        ref = copy.deepcopy(tiny[0]).train()
        if lora:
            ref = apply_lora(ref, r=4, alpha=8.0, dropout=0.0, target_modules=["q_proj", "up_proj"])
            with torch.no_grad():
                for n, p in ref.named_parameters():
                    if "lora_B" in n:
                        p.add_(0.05)
        routed = copy.deepcopy(ref)
        assert route_linears_(routed, "onednn") > 0
        assert any(type(m) is CPULinear for m in routed.modules())
        out = []
        for m in (ref, routed):
            loss = m(X, labels=X).loss
            loss.backward()
            out.append((loss.detach(), {n: p.grad for n, p in m.named_parameters() if p.grad is not None}))
        torch.testing.assert_close(out[1][0], out[0][0], rtol=1e-5, atol=1e-6)
        assert out[0][1].keys() == out[1][1].keys() and out[0][1]
        for n, g in out[0][1].items():
            torch.testing.assert_close(out[1][1][n], g, rtol=1e-4, atol=1e-6, msg=n)


@needs_onednn
def test_routed_model_decodes_and_checkpoints_like_the_mkl_one(tiny):
    from posttrain.training.checkpointing import checkpoint_layers

    ref = copy.deepcopy(tiny[0])
    routed = copy.deepcopy(ref)
    route_linears_(routed, "onednn")
    with torch.inference_mode():
        torch.testing.assert_close(routed(X).logits, ref(X).logits, rtol=1e-5, atol=1e-5)
    checkpoint_layers(routed.train(), True)
    ref.train()
    for m in (ref, routed):
        m(X, labels=X, use_cache=False).loss.backward()
    for (n, a), (_, b) in zip(ref.named_parameters(), routed.named_parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-6, msg=n)


def test_other_dtypes_and_subclasses_take_f_linear(monkeypatch):
    lin = torch.nn.Linear(8, 4).to(torch.bfloat16)
    lin.__class__ = CPULinear
    monkeypatch.setattr(matmul, "_lp", lambda *a: (_ for _ in ()).throw(AssertionError("oneDNN path taken")))
    x = torch.randn(3, 8, dtype=torch.bfloat16)
    torch.testing.assert_close(lin(x), torch.nn.functional.linear(x, lin.weight, lin.bias))


def test_the_setting_is_honoured_or_refused(tiny, monkeypatch):
    m = copy.deepcopy(tiny[0])
    n_linear = sum(type(x) is torch.nn.Linear for x in m.modules())
    assert route_linears_(m, "mkl") == 0 and not any(type(x) is CPULinear for x in m.modules())
    if onednn_works():
        assert route_linears_(m, "onednn") == n_linear
        assert route_linears_(m, "mkl") == 0 and sum(type(x) is torch.nn.Linear for x in m.modules()) == n_linear
    with pytest.raises(ValueError, match="cpu_matmul"):
        route_linears_(m, "blas")
    with pytest.raises(Exception, match="cpu_matmul"):
        load_config(None, ["model.cpu_matmul=blas"])
    monkeypatch.setattr(matmul, "_cpu_vendor", lambda: "GenuineIntel")
    assert matmul.use_onednn("auto") is False  # MKL is at home on Intel's CPUs
    monkeypatch.setattr(matmul, "_cpu_vendor", lambda: "AuthenticAMD")
    assert matmul.use_onednn("auto") is onednn_works()
    if onednn_works():
        # AMD: oneDNN trains too only with AVX-512 kernels (on AVX2 its weight gradient is slower than MKL's)
        monkeypatch.setattr(matmul, "_avx512", lambda: True)
        assert matmul.linear_class("auto") is CPULinear
        monkeypatch.setattr(matmul, "_avx512", lambda: False)
        assert matmul.linear_class("auto") is DecodeOneDNNLinear
        assert route_linears_(m, "auto") == n_linear and all(
            type(x) is DecodeOneDNNLinear for x in m.modules() if isinstance(x, torch.nn.Linear))
        assert matmul.linear_class("onednn") is CPULinear  # an explicit onednn means every product
    monkeypatch.setattr(matmul, "onednn_works", lambda: False)
    with pytest.raises(RuntimeError, match="does not run"):
        matmul.use_onednn("onednn")
    assert matmul.use_onednn("auto") is False


@needs_onednn
def test_a_run_builds_its_model_with_the_setting(tmp_path):
    from posttrain.loop.components import build

    base = ["model.name=tiny-random", "task.name=count-a", "logging.tensorboard=false", "logging.console=false",
            f"run.output_dir={tmp_path}"]
    c = build(load_config(None, [*base, "model.cpu_matmul=onednn"]), log=lambda s: None)
    assert any(type(m) is CPULinear for m in c.model.modules())
    c = build(load_config(None, [*base, "model.cpu_matmul=mkl"]), log=lambda s: None)
    assert not any(type(m) is CPULinear for m in c.model.modules())
    # The builder routes before LoRA wraps the Linears: peft takes a CPULinear as the base layer it adapts.
    c = build(load_config(None, [*base, "model.cpu_matmul=onednn", "lora.enabled=true"]), log=lambda s: None)
    assert any(type(m) is CPULinear for m in c.model.modules())
    assert any("lora_A" in n for n, _ in c.model.named_parameters())
    c.model(X, labels=X).loss.backward()
    assert all(p.grad is not None for p in c.model.parameters() if p.requires_grad)


@needs_onednn
def test_decode_only_routing_trains_through_f_linear_and_decodes_through_onednn(tiny, monkeypatch):
    """DecodeOneDNNLinear: no-grad passes take oneDNN, passes that build a graph take F.linear, and both give
    the plain model's results."""
    ref = copy.deepcopy(tiny[0])
    routed = copy.deepcopy(ref)
    for x in routed.modules():
        if type(x) is torch.nn.Linear:
            x.__class__ = DecodeOneDNNLinear
    calls = []
    real = matmul._lp
    monkeypatch.setattr(matmul, "_lp", lambda *a: calls.append(1) or real(*a))
    with torch.inference_mode():
        torch.testing.assert_close(routed(X).logits, ref(X).logits, rtol=1e-5, atol=1e-5)
    assert calls, "decode did not take oneDNN"
    calls.clear()
    for m in (ref, routed):
        m(X, labels=X).loss.backward()
    assert not calls, "training took oneDNN"
    for (n, a), (_, b) in zip(ref.named_parameters(), routed.named_parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-7, msg=n)
