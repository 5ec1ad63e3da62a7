"""reasoning-gym's datasets for `reasoning_gym:<dataset>` (tasks/reasoning_gym.py): the options checked against each
dataset's config and the spec that re-creates a dataset (built once per process and spec, here and in the scorers'
worker: _reasoning_gym_worker.py's `dataset_for`; here `build_dataset`, `dataset_spec`, `import_reasoning_gym`, which
tasks/reasoning_gym.py loads a task with). Entries travel as JSON text that keeps tuples, sets and non-string keys
(_reasoning_gym_worker.py's `dumps_entry`, `loads_entry`)."""

from __future__ import annotations

import dataclasses
import difflib
import json
from typing import Any

from posttrain.config.task_options import ReasoningGymOptions
from posttrain.envs.task import TaskLoadError

# The dataset a spec names (and entries as JSON) live with the scorers' worker process, which needs them without
# importing posttrain.
from posttrain.tasks._reasoning_gym_worker import dataset_for

INSTALL_HINT = "pip install 'posttrain[reasoning-gym]'"

# posttrain's own options (the model config/task_options.py checks them with); the rest are the dataset's.
POSTTRAIN_OPTIONS = tuple(ReasoningGymOptions.model_fields)


# ------------------------------------------------------------------------------------------- datasets and specs


def import_reasoning_gym():
    """The reasoning_gym package, or a TaskLoadError naming its install (a task load asks first)."""
    try:
        import reasoning_gym
    except ImportError:
        raise TaskLoadError(f"reasoning-gym is not installed: {INSTALL_HINT}") from None
    return reasoning_gym


def _registry() -> dict[str, tuple[type, type]]:
    import_reasoning_gym()
    from reasoning_gym.factory import DATASETS

    return DATASETS


def _check_name(name: str) -> None:
    known = _registry()
    if name in known:
        return
    near = difflib.get_close_matches(name, list(known), n=5, cutoff=0.5)
    hint = f"nearest: {', '.join(near)}" if near else f"{len(known)} datasets, e.g. {', '.join(sorted(known)[:8])}"
    raise TaskLoadError(
        f"reasoning-gym has no dataset {name!r} ({hint}); "
        "list them: python -c 'from reasoning_gym.factory import DATASETS; print(sorted(DATASETS))'"
    )


def config_keys(name: str) -> list[str]:
    """The config keys dataset `name` takes (its config dataclass's fields, less seed and size)."""
    _, config_cls = _registry()[name]
    return [f.name for f in dataclasses.fields(config_cls) if f.name not in ("seed", "size")]


def _check_config(name: str, config: dict[str, Any], where: str) -> None:
    bad = sorted(set(config) - set(config_keys(name)) - {"seed", "size"})
    if bad:
        raise TaskLoadError(
            f"{where}: reasoning-gym dataset {name!r} has no option {', '.join(map(repr, bad))}; its "
            f"options: {', '.join(config_keys(name)) or '(none)'}; posttrain's: "
            f"{', '.join(o for o in POSTTRAIN_OPTIONS if o != 'datasets')}"
        )


def build_dataset(spec: dict[str, Any]):
    """dataset_for, with reasoning-gym's own refusals (a bad value, a failed validate) as TaskLoadError."""
    try:
        return dataset_for(json.dumps(spec, sort_keys=True))
    except TaskLoadError:
        raise
    except (TypeError, ValueError, AssertionError, KeyError) as e:
        raise TaskLoadError(
            f"reasoning_gym:{spec['name']}: reasoning-gym refused the config "
            f"{spec['config']}: {type(e).__name__}: {e or '(a failed check)'}"
        ) from None


def _composite_specs(datasets: Any) -> list[dict[str, Any]]:
    """task.options.datasets: {name: {weight: w, config: {...}}} (or a list of {name, weight, config})."""
    if isinstance(datasets, dict):
        datasets = [{"name": k, **(v or {})} for k, v in datasets.items()]
    if not isinstance(datasets, list) or not datasets or not all(isinstance(d, dict) for d in datasets):
        raise TaskLoadError("reasoning_gym:composite needs task.options.datasets={name: {weight: w, config: {...}}}")
    out = []
    for d in datasets:
        extra = set(d) - {"name", "weight", "config"}
        if extra:
            raise TaskLoadError(
                f"reasoning_gym:composite: dataset entry {d.get('name')!r} has unknown keys "
                f"{sorted(extra)}; each takes weight and config"
            )
        name, weight, config = d.get("name"), d.get("weight", 1.0), dict(d.get("config") or {})
        if name == "composite":
            raise TaskLoadError("reasoning_gym:composite: a composite cannot hold another composite")
        _check_name(str(name))
        if not isinstance(weight, (int, float)) or isinstance(weight, bool) or not weight > 0:
            raise TaskLoadError(f"reasoning_gym:composite: {name!r} weight must be a positive number, got {weight!r}")
        _check_config(name, config, f"reasoning_gym:composite datasets.{name}.config")
        out.append({"name": name, "weight": float(weight), "config": config})
    return out


def dataset_spec(dataset: str, config: dict[str, Any], size: int, seed: int) -> dict[str, Any]:
    if dataset == "composite":
        extra = set(config) - {"datasets"}
        if extra:
            raise TaskLoadError(
                f"reasoning_gym:composite: unknown options {sorted(extra)}; each dataset's own "
                "config goes under datasets.<name>.config"
            )
        return {
            "name": "composite",
            "config": {"size": size, "seed": seed, "datasets": _composite_specs(config.get("datasets"))},
        }
    _check_name(dataset)
    _check_config(dataset, config, f"reasoning_gym:{dataset}")
    return {"name": dataset, "config": {**config, "size": size, "seed": seed}}
