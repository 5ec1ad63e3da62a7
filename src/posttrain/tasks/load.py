"""Load a task by name: a built-in, `reasoning_gym:<dataset>`, `path/to/file.py:make_task`, or
`package.module:make_task`.

The factory returns a Task, or a dict / tuple with the prompts and reward functions:
    {"train": rows_or_dataset, "eval": rows_or_dataset (optional), "rewards": [fn, ...], "weights": [...]}
    (train_rows, reward_funcs)
Optional dict keys: "max_tokens", "stop", and for tool use "tools" (plain functions), "max_turns", "final_tool",
"episode" (row -> per-episode tools, see envs/tool_env.py);
"env_factory" for any other Env; "demonstrate" (row -> replies) for a supervised warm start (`warm_start.steps`).
A sample passes when the first reward function scores >= 1.0 (the others only shape the reward).
Rows may be a list of dicts or a `datasets.Dataset`. Without eval rows, 10% of train (at most 64) is held out
(`rows.hold_out`; a single row has no eval set).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from posttrain.envs.task import Task, TaskLoadError
from posttrain.rewards.rows_file import json_value
from posttrain.rewards.rubric import RewardFunc, Rubric
from posttrain.rows import hold_out, is_hf_dataset
from posttrain.tasks import BUILTIN_TASKS, builtin_task_factory
from posttrain.tasks.user_files import import_callable, import_user_file

# The module name a task file is imported under (not importable by that name elsewhere: cluster/ray_episodes.py
# ships such modules' code by value).
USER_MODULE_PREFIX = "posttrain_user_task_"
REASONING_GYM_PREFIX = "reasoning_gym:"


def load_task(
    name: str, options: dict[str, Any] | None = None, seed: int = 0, max_observation_chars: int | None = None
) -> Task:
    """`max_observation_chars`: the config's cut of one observation (None: the task's own); it reaches a mixture's
    parts and a verifiers env's harness, which are built here."""
    options = dict(options or {})
    if name.startswith("verifiers:"):  # a verifiers environment (tasks/verifiers_task.py)
        from posttrain.tasks.verifiers_task import load_verifiers_task

        return load_verifiers_task(name, options, seed, max_observation_chars)
    if name == "mixture":  # its parts are loaded with the run's seed and cut (tasks/mixture.py)
        mixture = builtin_task_factory(name)  # by name, as every built-in: mixture.py loads its parts through here
        return mixture(_run_seed=seed, _max_observation_chars=max_observation_chars, **options)
    if name in BUILTIN_TASKS:
        factory = builtin_task_factory(name)
    elif name.startswith(REASONING_GYM_PREFIX):  # any reasoning-gym dataset (tasks/reasoning_gym.py)
        from posttrain.tasks import reasoning_gym

        factory = functools.partial(reasoning_gym.make_task, name[len(REASONING_GYM_PREFIX) :])
    elif ":" in name:
        factory = _load_factory(name)
    else:
        raise TaskLoadError(
            f"unknown task {name!r}: use a built-in ({', '.join(BUILTIN_TASKS)}), "
            "'reasoning_gym:<dataset>', 'path/to/file.py:make_task' or 'package.module:make_task'"
        )
    try:
        out = factory(**options)
    except TypeError as e:
        raise TaskLoadError(f"task factory {name!r} rejected options {options}: {e}") from None
    task = to_task(out, name, seed)
    if max_observation_chars is not None:
        task = dataclasses.replace(task, max_observation_chars=max_observation_chars)
    return task


def _load_factory(spec: str) -> Callable[..., Any]:
    def import_file(path: Path) -> Any:
        return import_user_file(path, f"{USER_MODULE_PREFIX}{abs(hash(_real(path)))}", "task file")

    return import_callable(spec, "task", import_file)


def _real(path: Path) -> str:
    """The file's real path (one module for every path to it); a path resolve() cannot follow (a symlink loop) as
    it is, for import_user_file to refuse with the reason."""
    try:
        return str(path.resolve())
    except (OSError, RuntimeError):  # RuntimeError: Python 3.11's "Symlink loop"
        return str(path.absolute())


def _rows(data: Any, what: str) -> list[dict[str, Any]]:
    if data is None:
        return []
    if is_hf_dataset(data):
        return list(data.to_list())
    if isinstance(data, list):
        return data
    raise TaskLoadError(f"{what} must be a list of dicts or a datasets.Dataset, got {type(data).__name__}")


def to_task(out: Any, name: str, seed: int = 0) -> Task:
    if isinstance(out, Task):
        return out
    if isinstance(out, tuple) and len(out) == 2:
        out = {"train": out[0], "rewards": out[1]}
    if not isinstance(out, dict) or "train" not in out or "rewards" not in out:
        raise TaskLoadError(
            f"task factory {name!r} must return a Task, a (rows, reward_funcs) tuple or a dict "
            "with 'train' and 'rewards'"
        )
    train = _rows(out["train"], "train rows")
    evals = _rows(out.get("eval"), "eval rows")
    funcs = out["rewards"]
    if callable(funcs):
        funcs = [funcs]
    if not funcs or not all(callable(f) for f in funcs):
        raise TaskLoadError(f"task {name!r}: 'rewards' must be a non-empty list of functions")
    if not evals:
        train, evals = hold_out(train, seed=seed)
    # The user's functions: checked callable above; what they return is checked when they are scored.
    rubric = Rubric.from_funcs(cast(list[RewardFunc], funcs), out.get("weights"))
    return Task(
        name=name,
        train_rows=train,
        eval_rows=evals,
        rubric=rubric,
        max_tokens=out.get("max_tokens"),
        stop=list(out.get("stop") or []),
        tools=list(out.get("tools") or []),
        max_turns=int(out.get("max_turns", 4 if out.get("tools") else 1)),
        final_tool=out.get("final_tool"),
        episode=out.get("episode"),
        env_factory=out.get("env_factory"),
        demonstrate=out.get("demonstrate"),
        group_rewards=list(out.get("group_rewards") or []),
    )


def apply_subset(task: Task, path: str) -> Task:
    """Keep only the rows a subset file lists (task.subset): {"train": [indices], "eval": [indices]}; a split the
    file leaves out is kept whole."""
    spec = json_value(Path(path), lambda m: TaskLoadError(f"task.subset: cannot read {m}"))
    if not isinstance(spec, dict) or not set(spec) & {"train", "eval"}:
        raise TaskLoadError(f"task.subset {path!r} must be an object with 'train' and/or 'eval' index lists")
    for split, attr in (("train", "train_rows"), ("eval", "eval_rows")):
        if split not in spec:
            continue
        rows, idx = getattr(task, attr), spec[split]
        if not isinstance(idx, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in idx):
            raise TaskLoadError(f"task.subset {path!r}: {split!r} must be a list of row indices")
        bad = [i for i in idx if not 0 <= i < len(rows)]
        if bad:
            raise TaskLoadError(
                f"task.subset {path!r}: {split} indices {bad[:5]} out of range (the task has "
                f"{len(rows)} {split} rows; was the file made with other task options?)"
            )
        if split == "train" and not idx:
            raise TaskLoadError(f"task.subset {path!r}: the train list is empty")
        task = dataclasses.replace(task, **{attr: [rows[i] for i in idx]})
    return task
