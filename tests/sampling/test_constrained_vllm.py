"""A constraint on the in-process vLLM engine (sampling/vllm_engine.py): passed as vLLM's structured outputs, every
finished completion validates, and the log-probs are of the masked distribution (a forced "{" has log-prob 0)."""

import asyncio
import json

import pytest

vllm = pytest.importorskip("vllm")
jsonschema = pytest.importorskip("jsonschema")

from posttrain.models.tiny import tiny_random_model  # noqa: E402
from posttrain.sampling.constrained import json_constraint  # noqa: E402
from posttrain.sampling.vllm_engine import EngineSpec, VLLMSampler  # noqa: E402
from posttrain.sampling.vllm_weights import write_model_folder  # noqa: E402
from posttrain.types import SampleParams  # noqa: E402

pytestmark = [pytest.mark.xdist_group("vllm"), pytest.mark.slow]  # one worker runs every engine

SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["n"],
    "additionalProperties": False,
}


def test_vllm_engine_honours_a_json_schema(tmp_path):
    model, tok = tiny_random_model(seed=3, hidden_size=128)
    folder = write_model_folder(model, tok, tmp_path / "model")
    engine = VLLMSampler(
        EngineSpec(model_dir=str(folder), max_model_len=256, kv_cache_gb=0.25, seed=0),
        tok,
        [tok.eos_token_id],
        log=lambda *_: None,
    )
    try:
        params = SampleParams(max_tokens=40, temperature=1.0, constraint=json_constraint(SCHEMA))
        (comps,) = asyncio.run(engine.sample([tok("count")["input_ids"]], params, n=6))
    finally:
        engine.close()
    finished = [c for c in comps if c.finish_reason == "stop"]
    assert finished
    for c in finished:
        jsonschema.validate(json.loads(c.text), SCHEMA)
        assert c.logprobs[0] == pytest.approx(0.0, abs=1e-4)  # "{" was the only token allowed first
