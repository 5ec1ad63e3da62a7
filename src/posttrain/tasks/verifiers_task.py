"""`task.name=verifiers:<spec>`: a `verifiers` (v1) environment as a posttrain task (docs/verifiers.md).

    verifiers:<taskset-id>           an installed taskset package, loaded by verifiers' own loader
                                     (`vf.environment_class`, `vf.resolve_env_config`): task.options are the env's
                                     config, verifiers' `[env]` block (`taskset: {...}`, `agent: {...}`, `id`, ...)
    verifiers:path/to/env.py         a file that is a verifiers plugin module (`__all__` exports its Taskset
                                     subclass, and its Env subclass when it has one); options as above
    verifiers:path/to/file.py:fn     fn(**task.options) returns a `vf.Env`, a `vf.Taskset` (played by verifiers'
    verifiers:package.module:fn      SingleAgentEnv) or a (Taskset, Env subclass) pair

posttrain's own options (VerifiersOptions, config/task_options.py: checked when the config is), taken out before
the rest go to verifiers: `n_train` / `n_eval` (how many tasks; an
infinite taskset needs n_train), `eval` (options for the held-out tasks' env, merged over the others, e.g.
`{taskset: {split: test}}`; without it `n_eval` (default 10%, at most 64) tasks are held out at random),
`max_tokens`, `timeout_s` (one episode, default 300), `request_timeout_s` (one model call, default 120),
`max_turns` (model calls per seat where the env sets no limit, default 16), `max_observation_chars` (of one env
message; task.max_observation_chars wins; default 8000), `pass_reward` (the reward whose score >= 1 is a pass;
default the first verifiers runs), `episode_threads` (episodes run at once, each on a thread and event loop of its
own, default 64),
`max_stuck_threads` (threads an env's blocking code may hold past `timeout_s`; at the cap new episodes fail until
one returns; default 8).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from posttrain.config.task_options import OptionsError, VerifiersOptions, parse
from posttrain.envs.task import Task, TaskLoadError
from posttrain.rows import hold_out
from posttrain.tasks.user_files import import_callable, import_user_file

PREFIX = "verifiers:"
DEFAULT_OBSERVATION_CHARS = 8000  # of one env message, when neither the options nor the config say


def load_verifiers_task(
    name: str, options: dict[str, Any] | None = None, seed: int = 0, max_observation_chars: int | None = None
) -> Task:
    """`max_observation_chars`: the config's (task.max_observation_chars), which wins over the options' own."""
    try:
        import verifiers.v1  # noqa: F401 - the optional dependency, checked before anything else
    except ImportError as e:
        raise TaskLoadError(f"task {name!r} needs verifiers: pip install 'posttrain[verifiers]' ({e})") from None
    from posttrain.envs.verifiers_env import VerifiersEnv, verifiers_rubric, vf_task_of

    spec = name.removeprefix(PREFIX)
    try:  # posttrain's own options, checked as the config checks them (config/task_options.py)
        own = parse(VerifiersOptions, options, "task.options")
    except OptionsError as e:
        raise TaskLoadError(f"verifiers env {spec!r}: {e}") from None
    cap = max_observation_chars or own.max_observation_chars or DEFAULT_OBSERVATION_CHARS
    rest = own.env_options
    env = _build(spec, rest, own, cap)
    train = _rows(env, own.n_train, "n_train")
    if "eval" in own.model_fields_set:
        evals = _rows(_build(spec, _merged(rest, dict(own.eval or {})), own, cap), own.n_eval, "n_eval")
    else:
        train, evals = _hold_out(train, own.n_eval, seed)
    if not train:
        raise TaskLoadError(f"verifiers env {spec!r} has no tasks")
    try:
        rubric = verifiers_rubric(vf_task_of(env, train[0]), own.pass_reward)
    except ValueError as e:
        raise TaskLoadError(str(e)) from None

    def env_factory(task: Task, tokenizer: Any, params: Any) -> VerifiersEnv:
        return VerifiersEnv(
            env,
            task,
            tokenizer,
            timeout_s=own.timeout_s,
            request_timeout_s=own.request_timeout_s,
            max_tokens=task.max_tokens,
            episode_threads=own.episode_threads,
            max_stuck_threads=own.max_stuck_threads,
        )

    return Task(
        name=name,
        train_rows=train,
        eval_rows=evals,
        rubric=rubric,
        env_factory=env_factory,
        description=f"verifiers environment {env.config.env_id}",
        max_tokens=own.max_tokens,
        max_observation_chars=cap,
    )


# ---- the verifiers env a spec names --------------------------------------------------------------------------


def _build(spec: str, options: dict[str, Any], own: VerifiersOptions, max_observation_chars: int) -> Any:
    """The verifiers Env for `spec`, its seats running posttrain's chat harness (envs/verifiers_env.py), each env
    message cut to `max_observation_chars`."""
    from pydantic import ValidationError

    from posttrain.envs.verifiers_env import with_posttrain_seats

    harness = {"max_observation_chars": max_observation_chars, "request_timeout_s": own.request_timeout_s}
    try:
        env_cls, config, taskset = _resolve(spec, options)
        env = env_cls(with_posttrain_seats(config, harness, own.max_turns))
    except (ImportError, ValidationError, TypeError, ValueError, AttributeError) as e:
        raise TaskLoadError(f"verifiers env {spec!r}: {type(e).__name__}: {e}") from None
    if taskset is not None:
        env.taskset = taskset  # the author's own object (the env built an equal one from its config)
    return env


def _resolve(spec: str, options: dict[str, Any]) -> tuple[type, Any, Any]:
    """(Env class, env config, the Taskset object to keep or None) for a spec."""
    import verifiers.v1 as vf

    target, _, attr = spec.rpartition(":")
    if not target:  # no function: an installed taskset id, or a plugin file
        return (*_from_id(_plugin_file(spec) if spec.endswith(".py") else spec, options), None)
    out = _function(target, attr)(**options)
    if isinstance(out, vf.Env):
        return type(out), out.config, None
    taskset, env_cls = out if isinstance(out, tuple) and len(out) == 2 else (out, None)
    if not isinstance(taskset, vf.Taskset) or not (env_cls is None or issubclass(env_cls, vf.Env)):
        raise TypeError(
            f"{target}:{attr} must return a verifiers Env, a Taskset or (Taskset, Env subclass), "
            f"got {type(out).__name__}"
        )
    from posttrain.envs.verifiers_harness import register_plugin_module

    classes = (type(taskset),) if env_cls is None else (type(taskset), env_cls)
    ts_id = register_plugin_module(_plugin_name(type(taskset)), *classes)
    data = {"taskset": {**taskset.config.model_dump(), "id": ts_id}}
    return (*_from_id(ts_id, data), taskset)


def _from_id(taskset_id: str, options: dict[str, Any]) -> tuple[type, Any]:
    """Verifiers' own loader: the env class the taskset (or `options['id']`) names, and its validated config."""
    import verifiers.v1 as vf

    data = _merged(options, {"taskset": {"id": taskset_id}})
    return vf.environment_class(taskset_id, data.get("id") or ""), vf.resolve_env_config(data)


def _plugin_file(path: str) -> str:
    """Import a plugin file under an id verifiers' loader finds (a module in sys.modules); return the id."""
    module = _import_file(Path(path).expanduser())
    return module.__name__


def _function(target: str, attr: str) -> Any:
    return import_callable(f"{target}:{attr}", "verifiers env", _import_file)


def _import_file(path: Path) -> Any:
    name = f"posttrain_vf_file_{abs(hash(str(path.resolve()))):x}"  # lower case: verifiers lower-cases plugin ids
    return import_user_file(path, name, "verifiers env file", reuse=True)


def _plugin_name(cls: type) -> str:
    return f"posttrain_vf_{cls.__name__.lower()}_{id(cls):x}"


# ---- rows ----------------------------------------------------------------------------------------------------


def _rows(env: Any, n: int | None, option: str) -> list[dict[str, Any]]:
    from posttrain.envs.verifiers_env import task_row

    taskset = env.taskset
    if not taskset.bounded and not n:
        raise TaskLoadError(f"{type(taskset).__name__} is an infinite taskset: set task.options.{option}")
    return [task_row(t) for t in (taskset.take(int(n)) if n else taskset)]


def _hold_out(rows: list[dict[str, Any]], n_eval: int | None, seed: int) -> tuple[list, list]:
    """(train, held-out): `n_eval` rows (default 10%, at most 64) drawn with `seed`: `rows.hold_out`, as every
    loader holds rows out."""
    return hold_out(rows, seed=seed, count=n_eval)  # n_eval >= 0: checked with the options


def _merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` merged into `base`, nested dicts merged key by key."""
    out = dict(base)
    for k, v in over.items():
        out[k] = _merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out
