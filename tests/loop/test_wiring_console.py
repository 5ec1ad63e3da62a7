"""The server backend's wiring (loop/wiring.py server_vllm_sampler) says what its vLLM servers do through the run's
console setting: `logging.console=false` silences them as it silences the rest of the run (issue 62)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from posttrain.config import load_config
from posttrain.loop import wiring


class _Started(Exception):
    pass


@pytest.mark.parametrize("console", [False, True])
def test_the_server_pool_logs_through_logging_console(monkeypatch, tmp_path, capsys, console):
    import posttrain.cluster.vllm_servers as vs
    import posttrain.sampling.engines as engines

    logs = []

    def start(*args, log, **kwargs):
        logs.append(log)
        raise _Started  # the pool would start servers here: what it was given is all the test looks at

    monkeypatch.setattr(vs.VLLMServerPool, "start", start)
    monkeypatch.setattr(engines, "work_dir", lambda cfg: tmp_path)
    monkeypatch.setattr(engines, "engine_model_dir", lambda *a, **k: str(tmp_path))
    monkeypatch.setattr(engines, "engine_spec", lambda *a, **k: SimpleNamespace(max_model_len=64))
    monkeypatch.setattr(wiring, "stop_token_ids", lambda *a: [0])
    monkeypatch.setattr(wiring, "run_budget", lambda *a: None)
    cfg = load_config(None, [f"logging.console={str(console).lower()}"])
    with pytest.raises(_Started):
        wiring.server_vllm_sampler(cfg, SimpleNamespace(model=None, tokenizer=None), False)
    capsys.readouterr()
    logs[0]("vllm servers: 2 up")
    out = capsys.readouterr().out
    assert ("vllm servers: 2 up" in out) == console, out
