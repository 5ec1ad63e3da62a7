import json

import pytest

from posttrain.obs import MetricsLogger, StageTimer, read_metrics
from posttrain.obs.console import eval_table, step_line
from posttrain.obs.report import write_report


def test_metrics_logger_writes_jsonl_and_survives_bad_values(tmp_path):
    log = MetricsLogger(str(tmp_path), tensorboard=False)
    log.log({"kind": "train", "step": 1, "reward/mean": 0.5, "x": float("nan")})
    log.log({"kind": "eval", "step": 1, "eval/pass_rate": 0.25})
    recs = read_metrics(str(tmp_path))
    assert recs[0]["reward/mean"] == 0.5 and recs[0]["x"] == "nan" and recs[1]["kind"] == "eval"


def test_logger_failure_does_not_raise(tmp_path):
    log = MetricsLogger(str(tmp_path / "gone"), tensorboard=False)  # folder missing: writes fail
    log.log({"kind": "train", "step": 1})
    log.log_samples(1, [{"a": 1}])
    assert log.errors == 2


def test_timer_accumulates(monkeypatch):
    import posttrain.obs.timers as timers

    clock = iter([10.0, 11.5, 20.0, 22.0, 30.0, 30.25])  # (start, end) of three blocks
    monkeypatch.setattr(timers.time, "perf_counter", lambda: next(clock))
    t = StageTimer()
    for stage in ("a", "a", "b"):
        with t(stage):
            pass
    assert t.metrics() == {"time/a": 3.5, "time/b": 0.25}  # the two "a" blocks add up


def test_step_line_and_eval_table():
    line = step_line(3, 10, {"reward/mean": 0.5, "pass/x": 0.25, "time/sample": 1.0})
    assert "step    3/10" in line and "x=0.25" in line and "sample=1.0s" in line
    table = eval_table("t", [("before", {"eval/pass_rate": 0.1}), ("after", {"eval/pass_rate": 0.5})])
    assert table.row_count == 1


def test_report_png(tmp_path):
    log = MetricsLogger(str(tmp_path), tensorboard=False)
    for s in range(1, 4):
        log.log({"kind": "train", "step": s, "reward/mean": s / 3, "pass/x": s / 4})
    log.log({"kind": "eval", "step": 3, "eval/pass_rate": 0.5})
    out = write_report(str(tmp_path))
    assert open(out, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(FileNotFoundError):
        write_report(str(tmp_path / "nope"))
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "metrics.jsonl").write_text(json.dumps({"kind": "other", "step": 1}) + "\n")
    with pytest.raises(ValueError, match="no train or eval records"):
        write_report(str(tmp_path / "e"))
