"""trainer.precision=bf16: forward and backward under bf16 autocast, fp32 weights, gradients and optimizer state."""

import copy

import pytest
import torch

from posttrain.algos import LOSSES, LossParams
from posttrain.config import ConfigError, load_config
from posttrain.models.matmul import CPULinear, onednn_works, route_linears_
from posttrain.training import Trainer

from batches import random_batch


def _grads(model):
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def _linear_output_dtypes(model):
    seen = []
    hooks = [m.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
             for m in model.modules() if isinstance(m, torch.nn.Linear)]
    return seen, hooks


@pytest.mark.parametrize("matmul", ["mkl", "onednn"])
def test_bf16_gradient_is_close_to_fp32_and_the_weights_stay_fp32(tiny, matmul):
    if matmul == "onednn" and not onednn_works():
        pytest.skip("oneDNN's inner product does not run here")
    model, tok = tiny
    route_linears_(model, matmul)
    batch = random_batch(len(tok), n_groups=3, seed=2)
    out = {}
    for precision in ("fp32", "bf16"):
        tr = Trainer(copy.deepcopy(model), pad_id=tok.pad_token_id, lr=1e-2, precision=precision)
        seen, hooks = _linear_output_dtypes(tr.model)
        m = tr.forward_backward(batch, LOSSES["ppo_clip"], LossParams()).metrics
        for h in hooks:
            h.remove()
        g = _grads(tr.model)
        out[precision] = (g, m, set(seen))
        assert all(p.dtype == torch.float32 for p in tr.model.parameters())
        assert g.dtype == torch.float32
        tr.optim_step()
        assert all(p.dtype == torch.float32 for p in tr.model.parameters())
        assert all(v.dtype == torch.float32 for s in tr.optimizers[0].state.values() for v in s.values()
                   if torch.is_tensor(v) and v.numel() > 1)
    # The matmuls really ran in bf16 (CPULinear hands autocast's products to F.linear), and only then.
    assert out["fp32"][2] == {torch.float32} and out["bf16"][2] == {torch.bfloat16}
    g32, g16 = out["fp32"][0], out["bf16"][0]
    assert not torch.equal(g32, g16)
    cos = torch.nn.functional.cosine_similarity(g32, g16, dim=0)
    assert cos > 0.99, cos
    assert out["bf16"][1]["train/loss"] == pytest.approx(out["fp32"][1]["train/loss"], abs=0.05)
    assert out["bf16"][1]["train/entropy"] == pytest.approx(out["fp32"][1]["train/entropy"], rel=0.05)


def test_bf16_log_probs_are_fp32_and_near_the_fp32_ones(tiny):
    model, tok = tiny
    batch = random_batch(len(tok), n_groups=2, seed=3)
    lp = {p: Trainer(model, pad_id=tok.pad_token_id, precision=p).compute_logprobs(batch) for p in ("fp32", "bf16")}
    diffs = [abs(a - b) for r32, r16 in zip(lp["fp32"], lp["bf16"]) for a, b in zip(r32, r16)]
    assert diffs and max(diffs) < 0.1 and sum(diffs) > 0  # bf16 rounding, not another model


def test_a_bad_precision_is_refused(tiny):
    model, tok = tiny
    with pytest.raises(ValueError, match="trainer.precision"):
        Trainer(model, pad_id=tok.pad_token_id, precision="fp16")
    with pytest.raises(ConfigError, match="trainer.precision.*'fp32' or 'bf16'"):
        load_config(None, ["trainer.precision=fp16"])


def test_a_bf16_trainer_takes_the_ratio_against_the_sampler_with_tis():
    cfg = load_config(None, ["trainer.precision=bf16"])
    assert cfg.algorithm.behavior_logprobs == "sampler" and cfg.algorithm.is_correction == "truncate"
    mine = load_config(None, ["trainer.precision=bf16", "algorithm.is_correction=none"])
    assert mine.algorithm.is_correction == "none"  # what the user set wins
    plain = load_config(None, [])
    assert plain.algorithm.behavior_logprobs == "policy" and plain.algorithm.is_correction == "none"


def test_cpu_linear_follows_autocast():
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 4)
    lin.__class__ = CPULinear
    x = torch.randn(3, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert lin(x).dtype == torch.bfloat16
    assert lin(x).dtype == torch.float32
