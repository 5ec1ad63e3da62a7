"""Trace events: spans go to trace.jsonl only while a run traces; the export is valid Chrome trace JSON."""

import json
import threading

from posttrain.obs import trace
from posttrain.obs.timers import StageTimer


def test_span_is_a_no_op_without_a_tracer(tmp_path):
    trace.stop()
    with trace.span("x"):
        pass
    assert not trace.enabled() and trace.read_trace(tmp_path) == []


def test_spans_and_stage_timer_write_events(tmp_path):
    trace.start(tmp_path / trace.TRACE_FILE)
    try:
        timer = StageTimer(worker="rollout-3")
        with timer("sample", step=2):
            pass
        with trace.span("train", worker="trainer", step=2):
            t = threading.Thread(target=_sync_span)  # the stepper's sync runs in a thread (async mode)
            t.start(), t.join()
        try:
            with trace.span("eval", worker="trainer"):
                raise RuntimeError("boom")  # a span that raises is still recorded
        except RuntimeError:
            pass
    finally:
        trace.stop()
    ev = trace.read_trace(tmp_path)
    assert [e["name"] for e in ev] == ["sample", "sync", "train", "eval"]  # written as each span ends
    assert ev[1]["tid"] != ev[2]["tid"]
    assert ev[0]["worker"] == "rollout-3" and ev[0]["args"] == {"step": 2} and timer.seconds["sample"] >= 0
    assert all(e["dur"] >= 0 and e["pid"] > 0 and e["tid"] > 0 for e in ev)
    (tmp_path / trace.TRACE_FILE).open("a").write('{"name": "half')  # a crash mid-line: skipped on read
    assert len(trace.read_trace(tmp_path)) == 4


def _sync_span():
    with trace.span("sync", worker="trainer"):
        pass


def test_chrome_trace_export_is_valid():
    ev = [{"name": "train", "worker": "trainer", "ts": 100.0, "dur": 0.5, "pid": 7, "tid": 7, "args": {"step": 1}},
          {"name": "sample", "worker": "rollout-10", "ts": 100.2, "dur": 0.7, "pid": 7, "tid": 7, "args": {}},
          {"name": "sample", "worker": "rollout-2", "ts": 100.1, "dur": 0.7, "pid": 7, "tid": 7, "args": {}}]
    out = json.loads(json.dumps(trace.to_chrome_trace(ev)))
    spans = [e for e in out["traceEvents"] if e["ph"] == "X"]
    assert len(spans) == 3
    for e in spans:
        assert {"name", "ph", "ts", "dur", "pid", "tid"} <= e.keys()
        assert isinstance(e["ts"], (int, float)) and e["dur"] > 0
    assert spans[0]["ts"] == 0 and spans[0]["dur"] == 500000.0  # microseconds from the first span
    names = {e["tid"]: e["args"]["name"] for e in out["traceEvents"] if e["name"] == "thread_name"}
    assert [names[t] for t in sorted(names)] == ["trainer", "rollout-2", "rollout-10"]  # one lane per worker
    assert trace.to_chrome_trace([]) == {"traceEvents": [], "displayTimeUnit": "ms"}
