"""`posttrain sft` and SFTL;DR: rows from a run's insights.jsonl, bad input refused with a message, and training
lowers the NLL of the targets on the tiny model."""

import json

import pytest
from typer.testing import CliRunner

from posttrain.cli import app
from posttrain.training.sft import SFTDataError, read_sft_rows, sft


def _insights_file(tmp_path):
    p = tmp_path / "insights.jsonl"
    rows = [{"kind": "insight", "key": "k1", "prompt": [{"role": "user", "content": "2+3="}], "insight": "add them"},
            {"kind": "success", "key": "k1", "prompt": [{"role": "user", "content": "2+3="}], "insights": ["add them"],
             "completion": "5"},
            {"kind": "insight", "key": "k2", "prompt": "2+2=", "insight": "count"}]
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return p


def test_rows_from_a_runs_insights(tmp_path):
    p = _insights_file(tmp_path)
    assert read_sft_rows(p) == [{"prompt": [{"role": "user", "content": "2+3="}], "completion": "add them"},
                                {"prompt": "2+2=", "completion": "count"}]
    assert read_sft_rows(tmp_path, "answer") == [{"prompt": [{"role": "user", "content": "2+3="}], "completion": "5"}]


@pytest.mark.parametrize("content,match", [
    ("", "empty"), ("{not json\n", "not JSON"), ("[1]\n", "expected an object"),
    ('{"prompt": "x"}\n', "non-empty completion"), ('{"prompt": 3, "completion": "y"}\n', "needs a prompt"),
    ('{"kind": "success", "prompt": "x", "completion": "y"}\n', "no insight rows"),
])
def test_bad_rows_are_refused(tmp_path, content, match):
    p = tmp_path / "rows.jsonl"
    p.write_text(content)
    with pytest.raises(SFTDataError, match=match):
        read_sft_rows(p)


def test_unknown_target_and_missing_file(tmp_path):
    with pytest.raises(SFTDataError, match="target"):
        read_sft_rows(tmp_path, "both")
    with pytest.raises(SFTDataError, match="cannot read"):
        read_sft_rows(tmp_path / "nope.jsonl")


def test_sft_lowers_the_nll_and_saves(tmp_path):
    rows = [{"prompt": [{"role": "user", "content": f"q{i}"}], "completion": "aaaa aaaa"} for i in range(4)]
    res = sft(rows, "tiny-random", tmp_path / "out", steps=30, lr=3e-3, batch_size=4, log=lambda s: None)
    assert res["nll_last"] < 0.7 * res["nll_first"], res
    assert (tmp_path / "out" / "config.json").exists()


def test_cli_reports_bad_input_without_a_traceback(tmp_path):
    r = CliRunner().invoke(app, ["sft", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "cannot read" in r.output and "Traceback" not in r.output
    p = _insights_file(tmp_path)
    r = CliRunner().invoke(app, ["sft", str(p), "--out", str(tmp_path / "o"), "--model", "tiny-random",
                                 "--steps", "2", "--batch-size", "2"])
    assert r.exit_code == 0, r.output
    assert "nll/token" in r.output and (tmp_path / "o" / "config.json").exists()
