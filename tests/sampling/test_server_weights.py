"""Pushing weights to an OpenAI-compatible server (`posttrain serve --weights-dir`): file + reload endpoint."""

import socket
import threading
import time

import httpx
import pytest
import torch

from posttrain.sampling.weight_ipc import ServerWeights, WeightSyncError, trainable_state
from posttrain.models import ensure_pad_token, load_model, stop_token_ids
from posttrain.sampling.hf_sampler import HFSampler
from posttrain.sampling.openai_server import create_app


def _serve(app):
    import uvicorn

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not server.started and time.time() < deadline:
        time.sleep(0.05)
    assert server.started
    return server, thread, f"http://127.0.0.1:{port}"


def test_trainer_push_reaches_the_served_model(tmp_path):
    served, tok = load_model("tiny-random", seed=1)
    ensure_pad_token(tok)
    sampler = HFSampler(served, tok, stop_token_ids(served, tok))
    server, thread, url = _serve(create_app(sampler, tok, weights_dir=str(tmp_path / "w")))
    try:
        trainer_model, _ = load_model("tiny-random", seed=2)  # different weights
        with torch.no_grad():
            next(trainer_model.parameters()).add_(0.5)
        m = ServerWeights(trainer_model, tmp_path / "w", url, timeout_s=30).push(3)
        assert m["time/weight_sync"] >= m["time/weight_file"] > 0
        assert httpx.get(f"{url}/health", timeout=10).json()["policy_version"] == 3
        for n, p in trainable_state(trainer_model).items():
            assert torch.equal(dict(served.named_parameters())[n], p), n
        r = httpx.post(f"{url}/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=30)
        assert r.json()["policy_version"] == 3  # completions now come from the pushed version
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def test_reload_endpoint_is_off_unless_asked(tmp_path):
    served, tok = load_model("tiny-random", seed=1)
    ensure_pad_token(tok)
    server, thread, url = _serve(create_app(HFSampler(served, tok, stop_token_ids(served, tok)), tok))
    try:
        assert httpx.post(f"{url}/update_weights_from_disk", json={}, timeout=10).status_code == 404
        with pytest.raises(WeightSyncError, match="2 tries"):
            ServerWeights(served, tmp_path / "w", url, timeout_s=5, retries=1).push(1)
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def test_a_server_that_is_down_fails_the_push_after_bounded_retries(tmp_path):
    model, _ = load_model("tiny-random")
    t0 = time.time()
    with pytest.raises(WeightSyncError, match="3 tries"):
        ServerWeights(model, tmp_path / "w", "http://127.0.0.1:9", timeout_s=2, retries=2).push(1)
    assert time.time() - t0 < 60
