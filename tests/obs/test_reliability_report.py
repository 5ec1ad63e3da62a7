"""The report's reliability diagram, for runs that logged decision bins (decision-routing)."""

import json

import pytest

pytest.importorskip("plotly")

from posttrain.obs.html_report import RunData, fig_reliability, write_html_report  # noqa: E402
from posttrain.rewards.calibration import bins_from_sums, ece, ece_from_bins  # noqa: E402


def _eval(step: int, conf: list[float], correct: list[float]) -> dict:
    rec = {"kind": "eval", "step": step, "eval/pass_rate": sum(correct) / len(correct)}
    for c, y in zip(conf, correct):
        b = f"eval/decision/rel/b{min(9, int(c * 10))}"
        rec[f"{b}/n"] = rec.get(f"{b}/n", 0) + 1
        rec[f"{b}/conf_sum"] = rec.get(f"{b}/conf_sum", 0.0) + c
        rec[f"{b}/correct_sum"] = rec.get(f"{b}/correct_sum", 0.0) + y
    return rec


def test_bins_from_sums_match_ece() -> None:
    conf, correct = [0.95, 0.9, 0.55, 0.2], [1, 0, 1, 0]
    rec = _eval(0, conf, correct)
    assert ece_from_bins(bins_from_sums(rec, "eval/decision/rel/")) == pytest.approx(ece(conf, correct))


def test_report_draws_reliability_only_when_logged(tmp_path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    train = {"kind": "train", "step": 1, "reward/mean": 0.5}
    recs = [_eval(0, [0.95] * 4, [1, 0, 0, 1]), train, _eval(1, [0.55, 0.6, 0.95], [1, 0, 1])]
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    fig = fig_reliability(RunData.load(run))
    assert fig is not None and len(fig.data) == 3  # the diagonal, the first and the last eval
    assert "ECE 0.450" in fig.data[1].name
    assert 'id="fig-reliability"' in write_html_report(run).read_text()
    (run / "metrics.jsonl").write_text(json.dumps(train) + "\n")
    assert 'id="fig-reliability"' not in write_html_report(run).read_text()
