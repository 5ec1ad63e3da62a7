"""bench/vs_trl.py runs posttrain with the options it is given (an earlier version printed an "int8" column that
had sampled in fp32: --precision never reached the config)."""

import importlib.util
from pathlib import Path

from posttrain.config import load_config

_spec = importlib.util.spec_from_file_location("vs_trl", Path(__file__).resolve().parents[2] / "bench" / "vs_trl.py")
vs_trl = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(vs_trl)


def _cfg(argv, only):
    args = vs_trl.parse_args(argv + ["--only", only])
    return load_config(None, vs_trl.posttrain_overrides(args, "/tmp/x"))


def test_precision_and_chunk_reach_the_posttrain_config():
    cfg = _cfg(["--precision", "int8", "--chunk", "512", "--model", "tiny-random"], "posttrain")
    assert cfg.sampling.precision == "int8" and cfg.trainer.logits_chunk_tokens == 512
    assert cfg.algorithm.behavior_logprobs == "sampler" and cfg.algorithm.is_correction == "truncate"
    fp32 = _cfg(["--precision", "int8", "--model", "tiny-random"], "posttrain_fp32")  # the column beside it
    assert fp32.sampling.precision == "fp32" and fp32.algorithm.is_correction == "none"
    plain = _cfg(["--model", "tiny-random"], "posttrain")
    assert plain.sampling.precision == "fp32" and plain.sampling.max_tokens == 64 and plain.sampling.stop == []
    assert not plain.trainer.gradient_checkpointing
    assert _cfg(["--checkpointing", "--model", "tiny-random"], "posttrain").trainer.gradient_checkpointing


def test_matmul_and_packing_reach_the_posttrain_config():
    cfg = _cfg(["--matmul", "mkl", "--packed", "on", "--model", "tiny-random"], "posttrain")
    assert cfg.model.cpu_matmul == "mkl" and cfg.sampling.packed_weights == "on"
    plain = _cfg(["--model", "tiny-random"], "posttrain")
    assert plain.model.cpu_matmul == "auto" and plain.sampling.packed_weights == "auto"


def test_train_precision_reaches_the_posttrain_config_and_not_the_fp32_column():
    cfg = _cfg(["--train-precision", "bf16", "--precision", "bf16", "--model", "tiny-random"], "posttrain")
    assert cfg.trainer.precision == "bf16" and cfg.sampling.precision == "bf16"
    fp32 = _cfg(["--train-precision", "bf16", "--precision", "bf16", "--model", "tiny-random"], "posttrain_fp32")
    assert fp32.trainer.precision == "fp32" and fp32.sampling.precision == "fp32"
    assert _cfg(["--model", "tiny-random"], "posttrain").trainer.precision == "fp32"


def test_posttrain_stage_medians_skip_the_warm_up_step_and_go_into_the_markdown():
    steps = [{"stages": {"forward_backward": 30.0, "sync": 9.0}},  # step 1: warm-up, left out
             {"stages": {"forward_backward": 7.0, "sync": 0.3}},
             {"stages": {"forward_backward": 9.0, "sync": 0.1, "reward": 0.01}},
             {"stages": {"forward_backward": 8.0, "sync": 0.2}}]
    assert vs_trl.stage_medians(steps) == {"forward_backward": 8.0, "reward": 0.01, "sync": 0.2}
    md = vs_trl.stage_markdown({"posttrain": {"steps": steps}, "trl": {"steps": [{}, {}]},
                            "posttrain_fp32": {"steps": steps[:2]}})
    assert "| stage | posttrain | posttrain_fp32 |" in md and "| forward_backward | 8.000 | 7.000 |" in md
    assert "| reward | 0.010 |  |" in md
    assert vs_trl.stage_markdown({"trl": {"steps": [{}]}}) == ""
