import subprocess
import sys

import pytest

from posttrain.config import Config, ConfigError, load_config


def test_defaults_and_overrides():
    cfg = load_config(None, ["trainer.lr=2e-5", "loop.steps=3", "lora.enabled=true", "sampling.stop=[a, b]"])
    assert cfg.trainer.lr == 2e-5 and cfg.loop.steps == 3 and cfg.lora.enabled is True
    assert cfg.sampling.stop == ["a", "b"]
    assert Config().model.name == "default" and Config().task.name == "json-extract"


def test_yaml_file_then_override(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("trainer:\n  lr: 0.001\nloop:\n  steps: 7\n")
    cfg = load_config(p, ["loop.steps=9"])
    assert cfg.trainer.lr == 0.001 and cfg.loop.steps == 9


def test_unknown_key_names_nearest():
    with pytest.raises(ConfigError, match=r"unknown key 'trainer.lrr'; did you mean 'trainer.lr'"):
        load_config(None, ["trainer.lrr=1e-5"])
    with pytest.raises(ConfigError, match=r"did you mean 'trainer'"):
        load_config(None, ["trainr.lr=1e-5"])


def test_unknown_key_in_yaml(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("loop:\n  stepz: 3\n")
    with pytest.raises(ConfigError, match=r"loop.stepz.*did you mean 'loop.steps'"):
        load_config(p)


def test_wrong_type_names_key_value_and_type():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["trainer.lr=fast"])
    assert "'trainer.lr' = 'fast'" in str(e.value) and "expected float" in str(e.value)
    with pytest.raises(ConfigError, match=r"'loop.steps' = 2.5.*expected int"):
        load_config(None, ["loop.steps=2.5"])


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    lst = tmp_path / "list.yaml"
    lst.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(lst)


def test_malformed_override():
    with pytest.raises(ConfigError, match="key.path=value"):
        load_config(None, ["trainer.lr"])
    with pytest.raises(ConfigError, match="is a value, not a section"):
        load_config(None, ["loop.steps=3", "loop.steps.x=1"])


def test_cross_field_validation():
    with pytest.raises(ConfigError, match="epsilon_high"):
        load_config(None, ["algorithm.epsilon_high=0.1"])
    with pytest.raises(ConfigError, match="num_generations"):
        load_config(None, ["algorithm.num_generations=1"])


def test_config_import_does_not_import_torch():
    code = "import sys, posttrain.config; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_device_and_dtype_resolution():
    from posttrain.models.policy import resolve_device, resolve_dtype

    assert load_config(None, []).model.device == "auto" and load_config(None, ["model.device=cuda:1"]).model.device == "cuda:1"
    with pytest.raises(ConfigError, match="model.device"):
        load_config(None, ["model.device=gpu"])
    assert resolve_dtype("auto", "cpu") == "float32" and resolve_dtype("auto", "cuda:0") == "bfloat16"
    assert resolve_dtype("float16", "cpu") == "float16"
    import torch

    assert resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device"):
            resolve_device("cuda")


def test_algorithm_name_on_the_command_line_overrides_a_written_out_file(tmp_path):
    """configs/json_extract.yaml writes every algorithm field out; naming another preset on the command line
    must change the fields that preset sets (it once changed only the name: `posttrain auto` searched an inert key)."""
    from pathlib import Path

    from posttrain.config import load_config

    base = Path(__file__).resolve().parents[2] / "configs" / "json_extract.yaml"
    cfg = load_config(base, ["algorithm.name=dr_grpo"])
    assert (cfg.algorithm.advantage, cfg.algorithm.aggregation) == ("dr_grpo", "seq-mean-token-sum-norm")
    assert load_config(base, ["algorithm.name=rloo"]).algorithm.advantage == "rloo"
    # a field set on the command line still wins, before or after the name
    cfg = load_config(base, ["algorithm.aggregation=token-mean", "algorithm.name=dr_grpo"])
    assert (cfg.algorithm.advantage, cfg.algorithm.aggregation) == ("dr_grpo", "token-mean")
    # switching away from a preset that set fields resets them to the new preset's (here: the defaults)
    dapo = tmp_path / "dapo.yaml"
    dapo.write_text("algorithm:\n  name: dapo\n  dynamic_sampling: true\n  epsilon_high: 0.28\n  beta: 0.01\n")
    cfg = load_config(dapo, ["algorithm.name=grpo"])
    assert cfg.algorithm.dynamic_sampling is False and cfg.algorithm.epsilon_high is None
    assert cfg.algorithm.beta == 0.01  # not a preset field: the file's value stays
    # a file's own explicit fields beside its own name still win (no command-line name)
    assert load_config(dapo, []).algorithm.epsilon_high == 0.28
