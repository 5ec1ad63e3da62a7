"""Activation (gradient) checkpointing of the decoder layers (`trainer.gradient_checkpointing`).

Forward keeps only each layer's input; backward re-runs the layer. This rides on transformers' own switch
(`GradientCheckpointingLayer.gradient_checkpointing` and its `_gradient_checkpointing_func`), non-reentrant, with one
change: transformers drops the KV cache under checkpointing because a replayed layer would append to it again, and
posttrain's prefix sharing needs that cache. The trainer's caches are replay-safe (training/logprobs.py marks their
layers `replay_safe`), so the cache is kept for them; a call with any other cache runs that layer unchecked.
"""

from __future__ import annotations

from torch.utils.checkpoint import checkpoint

from posttrain.obs.memory import release_free_heap


def _checkpoint_if_replay_safe(layer_call, *args):
    """transformers calls this with partial(layer.forward, **kwargs). A cache of any other kind (a DynamicCache that
    a caller's default `use_cache` created) would grow again on replay, so that call runs without checkpointing."""
    kw = getattr(layer_call, "keywords", {})
    cache = kw.get("cache", kw.get("past_key_values"))
    if cache is not None and not all(getattr(lay, "replay_safe", False) for lay in cache.layers):
        return layer_call(*args)
    calls = [0]

    def run(*a):
        if calls[0]:  # the replay, in backward: the previous layer's freed pages go back to the OS first
            release_free_heap()
        calls[0] += 1
        return layer_call(*a)

    return checkpoint(run, *args, use_reentrant=False)


def checkpoint_layers(model, enabled: bool = True) -> int:
    """Activation (gradient) checkpointing of every decoder layer: forward keeps only each layer's input, backward
    re-runs the layer. Uses transformers' own switch on its `GradientCheckpointingLayer`s, non-reentrant, and allows
    the cache there because the trainer's caches are replay-safe (training/logprobs.py). Returns the number of
    layers switched."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    n = 0
    for m in model.modules():
        if isinstance(m, GradientCheckpointingLayer):
            m.gradient_checkpointing = enabled
            # ignored: nn.Module.__setattr__ is typed for tensors and modules; a plain attribute is allowed at run time
            m._gradient_checkpointing_func = _checkpoint_if_replay_safe  # pyright: ignore[reportArgumentType]
            m._can_checkpoint_with_cache = enabled
            n += 1
    if enabled and n == 0:
        raise ValueError(
            f"trainer.gradient_checkpointing: {type(model).__name__} has no checkpointable decoder layers "
            "(transformers' GradientCheckpointingLayer)"
        )
    return n
