"""bench/precision_parity.py trains each arm with the precisions it names (the low-precision arm's trainer too)."""

import argparse
import importlib.util
from pathlib import Path

from posttrain.config import load_config

_spec = importlib.util.spec_from_file_location(
    "precision_parity", Path(__file__).resolve().parents[2] / "bench" / "precision_parity.py")
pp = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pp)


def _cfg(cmd):
    return load_config(None, cmd[cmd.index("train") + 1:])


def test_each_arm_reaches_the_config_with_its_precisions(tmp_path):
    args = argparse.Namespace(steps=3, out=str(tmp_path))
    low = _cfg(pp.command("bf16", 1, args, eval_before=False, trainer_prec="bf16"))
    assert low.sampling.precision == "bf16" and low.trainer.precision == "bf16" and low.run.seed == 1
    assert low.run.name == "bf16-trainer-bf16-s1" and low.loop.steps == 3 and not low.loop.eval_before
    base = _cfg(pp.command("fp32", 1, args, eval_before=True))
    assert base.sampling.precision == "fp32" and base.trainer.precision == "fp32" and base.run.name == "fp32-s1"
    assert pp.arm_name("bf16", "fp32") == "bf16"  # the name earlier results were saved under
