"""Rewards named in the config (`task.rewards`), added to any task's rubric without code.

    task:
      rewards:
        - {fn: reward_model, path: runs/rm/product-blurb, weight: 0.5}
        - {fn: embedding_margin, weight: 1.0}          # needs the rows' query / engaged columns

Each entry: `fn` (a name in REWARD_FACTORIES), optional `weight` (1.0) and `name` (default: the fn), and the
factory's keyword arguments (reward_model: path, batch_size, device, max_length; embedding_margin: model,
device, format_penalty). The components are appended to the task's rubric with weight `weight`; they never
decide the pass (their pass threshold is -inf), so the task's own headline metric stays what it was.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from posttrain.rewards.rubric import RewardComponent, Rubric


class RewardConfigError(ValueError):
    pass


def _reward_model(**kw: Any) -> Callable[..., Any]:
    from posttrain.rewards.reward_model import reward_model

    if "path" not in kw:
        raise RewardConfigError("task.rewards: a reward_model entry needs `path` (a folder `posttrain rm train` wrote)")
    return reward_model(**kw)


def _embedding_margin(**kw: Any) -> Callable[..., Any]:
    from posttrain.rewards.embedding import embedding_margin

    return embedding_margin(**kw)


REWARD_FACTORIES: dict[str, Callable[..., Callable[..., Any]]] = {
    "reward_model": _reward_model,
    "embedding_margin": _embedding_margin,
}


def components_from_specs(specs: list[dict[str, Any]]) -> list[RewardComponent]:
    out = []
    for i, spec in enumerate(specs):
        if not isinstance(spec, dict) or "fn" not in spec:
            raise RewardConfigError(f"task.rewards[{i}] must be a mapping with `fn` (one of {', '.join(REWARD_FACTORIES)}), "
                             f"got {spec!r}")
        kw = dict(spec)
        fn_name = kw.pop("fn")
        if fn_name not in REWARD_FACTORIES:
            raise RewardConfigError(f"task.rewards[{i}]: unknown fn {fn_name!r}; known: {', '.join(REWARD_FACTORIES)}")
        weight = float(kw.pop("weight", 1.0))
        name = str(kw.pop("name", fn_name))
        try:
            func = REWARD_FACTORIES[fn_name](**kw, name=name)
        except TypeError as e:
            raise RewardConfigError(f"task.rewards[{i}] ({fn_name}): {e}") from None
        out.append(RewardComponent(name=name, func=func, weight=weight, pass_threshold=float("-inf")))
    return out


def add_rewards(rubric: Rubric, specs: list[dict[str, Any]]) -> Rubric:
    """A new rubric: `rubric`'s components, then the ones `specs` name (names must stay unique)."""
    if not specs:
        return rubric
    return Rubric(components=[*rubric.components, *components_from_specs(specs)],
                  pass_component=rubric.pass_component, normalize=rubric.normalize, timeout_s=rubric.timeout_s)
