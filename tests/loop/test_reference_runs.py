"""Behaviour kept across refactors: seeded runs reproduce the train records committed in tests/loop/reference/
(recorded before the loop redesign by scripts/reference_metrics.py; timings left out)."""

import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "reference_metrics", Path(__file__).resolve().parents[2] / "scripts" / "reference_metrics.py")
ref = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ref)


@pytest.mark.parametrize("name", ["tiny_count_a", "tiny_shaping", "tiny_kl_loss"])
def test_tiny_runs_match_the_reference(name):
    assert ref.train_records(name) == ref.reference(name)


@pytest.mark.slow  # about 2-4 minutes on 2 cores: the real default model
def test_default_model_json_extract_matches_the_reference():
    assert ref.train_records("default_json_extract") == ref.reference("default_json_extract")
