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
    assert ref.differences(ref.train_records(name), ref.reference(name)) == []


def test_the_comparison_catches_a_changed_value_and_forgives_the_last_bits():
    want = [{"kind": "train", "step": 1, "train/loss": -0.027658689767, "train/grad_norm": 0.6607426404953003,
             "tokens/trained": 188.0, "train/sampler_kl_k3": 0.0}]
    last_bits = [dict(want[0], **{"train/loss": -0.027658702805, "train/grad_norm": 0.6607427597045898,
                                  "train/sampler_kl_k3": 3e-8})]
    assert ref.differences(last_bits, want) == []
    assert ref.differences([dict(want[0], **{"train/loss": -0.0277})], want) == [
        "record 0: train/loss = -0.0277, reference -0.027658689767"]
    assert ref.differences([dict(want[0], **{"tokens/trained": 189.0})], want)  # a count one off is a change
    assert ref.differences([dict(want[0], step=2)], want)
    assert ref.differences([{k: v for k, v in want[0].items() if k != "train/loss"}], want) == [
        "record 0: train/loss only in the reference"]
    assert ref.differences(want + want, want) == ["2 records, the reference has 1"]


@pytest.mark.slow  # about 2-4 minutes on 2 cores: the real default model
def test_default_model_json_extract_matches_the_reference():
    assert ref.differences(ref.train_records("default_json_extract"), ref.reference("default_json_extract")) == []
