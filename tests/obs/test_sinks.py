"""Tracker sinks (trackio, W&B): off by default, a missing package only warns, the calls a run makes."""

import importlib.machinery
import os
import subprocess
import sys
import types

import pytest

from posttrain.config import load_config
from posttrain.obs.metrics import MetricsLogger
from posttrain.obs.sinks import TrackerSink, numeric, tracker_sinks


def fake_wandb(calls):
    mod = types.ModuleType("wandb")
    mod.__spec__ = importlib.machinery.ModuleSpec("wandb", None)  # transformers probes importlib.util.find_spec

    class Run:
        def log(self, data, step=None):
            calls.append(("log", data, step))

        def finish(self):
            calls.append(("finish",))

    def init(**kw):
        calls.append(("init", kw))
        return Run()

    mod.init = init
    return mod


def test_sinks_are_off_by_default(tmp_path):
    cfg = load_config(None, [])
    assert cfg.logging.trackio is False and cfg.logging.wandb is False
    assert tracker_sinks(cfg, tmp_path) == []


def test_numeric_keeps_numbers_and_prefixes_other_kinds():
    assert numeric({"kind": "train", "step": 3, "reward/mean": 0.5, "ok": True, "s": "x"}) == {"reward/mean": 0.5}
    assert numeric({"kind": "remedy", "step": 3, "level": 2}) == {"remedy/level": 2.0}


def test_a_run_with_wandb_faked_and_trackio_missing(tmp_path, monkeypatch, capsys):
    calls = []
    monkeypatch.setitem(sys.modules, "wandb", fake_wandb(calls))
    monkeypatch.setitem(sys.modules, "trackio", None)  # import trackio -> ImportError
    from posttrain.loop import train

    res = train(load_config(None, ["model.name=tiny-random", "task.name=count-a", "loop.steps=2",
                                   "loop.eval_prompts=2", "loop.save_every=0", "logging.tensorboard=false",
                                   "logging.console=false", "logging.wandb=true", "logging.trackio=true",
                                   "logging.project=ptest", f"run.output_dir={tmp_path}", "run.name=w"]))
    assert res.steps == 2  # the missing tracker did not fail the run
    err = capsys.readouterr().err
    assert err.count("logging.trackio=true but trackio is not installed") == 1
    init = calls[0]
    assert init[0] == "init" and init[1]["project"] == "ptest" and init[1]["name"] == "w"
    assert init[1]["dir"] == str(res.run_dir) and init[1]["config"]["logging"]["wandb"] is True
    logs = [c for c in calls if c[0] == "log"]
    assert [c[2] for c in logs] == [0, 1, 2, 2]  # eval before, 2 train steps, eval after
    assert "reward/mean" in logs[1][1] and "eval/pass_rate" in logs[-1][1]
    assert calls[-1] == ("finish",)


def test_a_failing_tracker_is_dropped_with_one_warning(tmp_path, monkeypatch, capsys):
    calls = []
    mod = fake_wandb(calls)
    monkeypatch.setitem(sys.modules, "wandb", mod)
    sink = TrackerSink("wandb", "p", "n", {})
    sink.run.log = lambda *a, **k: (_ for _ in ()).throw(ConnectionError("offline"))
    log = MetricsLogger(str(tmp_path), tensorboard=False, sinks=[sink])
    for s in range(3):
        log.log({"kind": "train", "step": s, "x": 1.0})
    log.close()
    assert capsys.readouterr().err.count("wandb log failed") == 1 and sink.run is None
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 3  # metrics.jsonl unaffected


def test_trackio_for_real_when_installed(tmp_path):
    pytest.importorskip("trackio")
    # A fresh process: trackio reads TRACKIO_DIR (where its local database goes) when it is imported.
    code = ("from posttrain.obs.sinks import TrackerSink\n"
            "s = TrackerSink('trackio', 'ptest', 'r1', {'a': 1})\n"
            "s.log({'kind': 'train', 'step': 1, 'reward/mean': 0.25}); s.close()\n")
    r = subprocess.run([sys.executable, "-c", code], env={**os.environ, "TRACKIO_DIR": str(tmp_path)},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "warning" not in r.stderr, r.stderr
    import sqlite3

    rows = sqlite3.connect(tmp_path / "ptest.db").execute("select step, metrics from metrics").fetchall()
    assert rows and rows[0][0] == 1 and b"reward/mean" in rows[0][1]
