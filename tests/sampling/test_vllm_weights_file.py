"""What a vLLM server reloads from a file (sampling/vllm_weights.py servable_state) and how it is written
(sampling/weight_ipc.py save_safetensors_atomic): cast, untied, one storage per name, never half-written."""

import torch

from posttrain.sampling.vllm_weights import servable_state
from posttrain.sampling.weight_ipc import save_safetensors_atomic


def test_a_tied_model_gets_its_output_layer_as_a_copy_in_the_servers_dtype(tmp_path):
    emb = torch.randn(4, 3)
    state = {"model.embed_tokens.weight": emb, "model.norm.weight": torch.ones(3), "step": torch.tensor([7])}
    out = servable_state(state, "bfloat16", tied=True)
    assert out["lm_head.weight"].dtype == torch.bfloat16 and torch.equal(out["lm_head.weight"],
                                                                          out["model.embed_tokens.weight"])
    assert out["lm_head.weight"].untyped_storage().data_ptr() != \
        out["model.embed_tokens.weight"].untyped_storage().data_ptr()
    assert out["step"].dtype == torch.int64  # only floating tensors are cast
    assert "lm_head.weight" not in servable_state(state, "float32", tied=False)
    from safetensors.torch import load_file

    save_safetensors_atomic(out, tmp_path / "model.safetensors", metadata={"format": "pt"})
    back = load_file(tmp_path / "model.safetensors")
    assert set(back) == set(out) and torch.equal(back["lm_head.weight"], out["lm_head.weight"])
    assert [p.name for p in tmp_path.iterdir()] == ["model.safetensors"]  # no temp file left behind
