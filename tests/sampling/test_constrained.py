"""Grammar-constrained decoding on the own sampler (sampling/constrained.py, hf_sampler.py)."""

import json
import time

import pytest
import torch

pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

from posttrain.models import stop_token_ids  # noqa: E402 - imported once the optional extras are known to be there
from posttrain.sampling import HFSampler  # noqa: E402 - imported once the optional extras are known to be there
from posttrain.sampling.constrained import (  # noqa: E402 - imported once the optional extras are known to be there
    MAX_SCHEMA_CHARS,
    ConstraintError,
    check_constraint,
    json_constraint,
    tool_call_grammar,
)
from posttrain.types import SampleParams  # noqa: E402 - imported once the optional extras are known to be there

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.fixture
def sampler(tiny):
    model, tok = tiny
    return HFSampler(model, tok, stop_token_ids(model, tok), seed=0), tok


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_finished_completion_validates_against_the_schema(sampler, seed):
    s, tok = sampler
    params = SampleParams(max_tokens=80, temperature=1.0, seed=seed, constraint=json_constraint(PERSON))
    (comps,) = s.sample_sync([tok("hi")["input_ids"]], params, n=8)
    finished = [c for c in comps if c.finish_reason == "stop"]
    assert len(finished) >= 4  # the grammar closes the object; a random model still finishes most within 80
    for c in finished:
        jsonschema.validate(json.loads(c.text), PERSON)


def test_json_object_gives_a_json_object(sampler):
    s, tok = sampler
    params = SampleParams(max_tokens=60, seed=3, constraint=json_constraint(None))
    (comps,) = s.sample_sync([tok("hi")["input_ids"]], params, n=6)
    finished = [c for c in comps if c.finish_reason == "stop"]
    assert finished
    assert all(isinstance(json.loads(c.text), dict) for c in finished)


def test_unconstrained_sampling_is_unchanged(sampler):
    s, tok = sampler
    a = s.sample_sync([tok("hi")["input_ids"]], SampleParams(max_tokens=20, seed=5), n=3)
    b = s.sample_sync([tok("hi")["input_ids"]], SampleParams(max_tokens=20, seed=5, constraint=None), n=3)
    assert [c.token_ids for c in a[0]] == [c.token_ids for c in b[0]]


def test_constrained_logprobs_are_of_the_masked_renormalised_distribution(sampler):
    """The behaviour log-probs recorded for a constrained row are log softmax over the allowed tokens: higher than
    the unmasked model's log-prob of the same token wherever the mask removed mass, never lower."""
    s, tok = sampler
    prompt = tok("hi")["input_ids"]
    params = SampleParams(max_tokens=30, seed=7, constraint=json_constraint(PERSON))
    (comps,) = s.sample_sync([prompt], params, n=2)
    for c in comps:
        ids = torch.tensor([prompt + c.token_ids])
        with torch.no_grad():
            logits = s.model(input_ids=ids).logits[0, len(prompt) - 1 : -1]
        full = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(c.token_ids)[:, None]).squeeze(-1)
        got = torch.tensor(c.logprobs)
        assert (got >= full - 1e-4).all()
        assert (got > full + 1e-3).sum() >= len(c.token_ids) // 2  # the mask moved most steps' mass
        assert c.logprobs[0] == pytest.approx(0.0, abs=1e-5)  # "{" is the only token a JSON object starts with


def test_bad_schemas_are_refused_quickly():
    deep: dict = {"type": "integer"}
    for _ in range(200):
        deep = {"type": "object", "properties": {"a": deep}}
    big = {
        "type": "object",
        "properties": {f"p{i}": {"type": "string", "description": "x" * 1000} for i in range(1000)},
    }
    bad = [
        {"type": "no-such-type"},
        deep,
        big,
        {"type": "string", "pattern": "((a{100}){100}){100}"},
        {"type": "string", "pattern": "(" * 40 + "a" + ")" * 40},
        {"type": "object", "properties": "nope"},
    ]
    for schema in bad:
        t = time.monotonic()
        with pytest.raises(ConstraintError):
            check_constraint(json_constraint(schema))
        assert time.monotonic() - t < 20
    assert len(json.dumps(big)) > MAX_SCHEMA_CHARS


def test_a_failed_compile_in_the_sampler_is_a_value_error_and_the_sampler_keeps_serving(sampler):
    s, tok = sampler
    from posttrain.types import Constraint

    with pytest.raises(ValueError):
        s.sample_sync([tok("hi")["input_ids"]], SampleParams(max_tokens=5, constraint=Constraint("lark", "start: (")))
    (ok,) = s.sample_sync([tok("hi")["input_ids"]], SampleParams(max_tokens=5), n=1)
    assert len(ok[0].token_ids) >= 1


def test_tool_call_grammar_completes_a_hermes_call(sampler):
    s, tok = sampler
    schemas = {"add": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}
    c = tool_call_grammar("hermes", schemas, None)
    assert c is not None
    (comps,) = s.sample_sync([tok("hi")["input_ids"]], SampleParams(max_tokens=60, seed=1, constraint=c), n=4)
    for comp in comps:
        if comp.finish_reason == "stop":
            assert comp.text.startswith('add", "arguments": {"a": ') and comp.text.endswith("}\n</tool_call>")
    assert tool_call_grammar("mistral", schemas, None) is None  # not JSON-shaped: the opening alone is forced


@pytest.mark.slow
def test_default_model_json_schema_samples_validate():
    """SmolLM2-135M-Instruct, N=8 at temperature 1.0 on a small object schema: every sample that finishes within
    max_tokens validates; the share that finished is printed (run with -s to see it)."""
    from posttrain.models import load_model, render_prompt
    from posttrain.models.default import default_model_dir

    model, tok = load_model(str(default_model_dir()))
    s = HFSampler(model, tok, stop_token_ids(model, tok), seed=0)
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}, "population": {"type": "integer", "minimum": 0}},
        "required": ["city", "population"],
        "additionalProperties": False,
    }
    prompt = render_prompt(tok, [{"role": "user", "content": "Give a city and its population as JSON."}])
    t = time.monotonic()
    params = SampleParams(max_tokens=48, temperature=1.0, seed=0, constraint=json_constraint(schema))
    (comps,) = s.sample_sync([prompt], params, n=8)
    finished = [c for c in comps if c.finish_reason == "stop"]
    print(
        f"\ndefault model: {len(finished)}/8 finished within 48 tokens in {time.monotonic() - t:.1f}s; "
        f"e.g. {finished[0].text if finished else comps[0].text!r}"
    )
    for c in finished:
        jsonschema.validate(json.loads(c.text), schema)
    assert finished
