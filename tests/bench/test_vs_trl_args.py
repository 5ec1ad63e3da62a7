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
