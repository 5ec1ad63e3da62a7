"""reasoning-gym's scorers (`reasoning_gym:<dataset>`, tasks/reasoning_gym.py) in a process of their own, and what
both sides need without posttrain: entries as JSON text, the dataset a spec names.

Run by worker_pool.WorkerPool as `python -I _reasoning_gym_worker.py PARENT_PID MEMORY_BYTES CPU_S`, like the
math checker (rewards/_math_worker.py), whose fork-per-request loop it reuses with the regex worker's limits,
request loop and parent watch (both loaded by path: this script never imports posttrain). It imports reasoning-gym
once, says `ready`, then answers one JSON line per request:

    {"specs": [spec JSON, ...], "rows": [[spec index, entry JSON, answer], ...], "timeout": s per row,
     "budget": s for all the rows}
    -> {"results": [score | "timeout" | "error" | "nonfinite", ...]}    one per row, in order

score: what the dataset's `score_answer` returned, a finite number; "nonfinite": it returned NaN or an infinity;
"error": it raised, returned no number, or its process died (out of memory); "timeout": it ran past its time (or
the request past its budget) and its process was killed.

Why a process: a scorer on hostile text can run for minutes, in Python or in C (rubiks_cube writes `R9999999` out
as ten million moves), and a thread cannot be stopped. The datasets are built here, once per spec, outside the
rows' time; the rows are scored in a forked child (which has them already) that is killed at a row's deadline, and
the next child takes the rows after it. Anything a scorer prints goes nowhere: stdout carries only the replies.
"""

import functools
import gc
import importlib.util
import json
import math
import numbers
import os
import signal
import sys
from pathlib import Path
from typing import Any

CACHE_SIZE = 16  # datasets kept per process


# ------------------------------------------------------------------------------------------ entries as JSON text


def dumps_entry(entry: Any) -> str:
    """An entry as JSON that `loads_entry` turns back into equal Python values: tuples, sets and dicts with
    non-string keys are tagged (scorers compare metadata tuples, e.g. arc_agi's grids; graph_color keys by int)."""
    return json.dumps(_tag(entry), sort_keys=True)


def loads_entry(text: str) -> Any:
    return json.loads(text, object_hook=_untag)


def _tag(x: Any) -> Any:
    if isinstance(x, dict):
        if all(isinstance(k, str) for k in x) and not any(k.startswith("__rg_") for k in x):
            return {k: _tag(v) for k, v in x.items()}
        return {"__rg_items__": [[_tag(k), _tag(v)] for k, v in x.items()]}
    if isinstance(x, tuple):
        return {"__rg_tuple__": [_tag(v) for v in x]}
    if isinstance(x, (set, frozenset)):
        return {"__rg_set__": [_tag(v) for v in x]}
    if isinstance(x, list):
        return [_tag(v) for v in x]
    if hasattr(x, "tolist"):  # numpy arrays and scalars
        return _tag(x.tolist())
    if x is None or isinstance(x, (str, int, float, bool)):
        return x
    return str(x)  # nothing in reasoning-gym 0.1.25's entries gets here


def _untag(d: dict) -> Any:
    if len(d) == 1:
        ((k, v),) = d.items()
        if k == "__rg_tuple__":
            return tuple(v)
        if k == "__rg_set__":
            return set(v)
        if k == "__rg_items__":
            return {(tuple(a) if isinstance(a, list) else a): b for a, b in v}
    return d


# ------------------------------------------------------------------------------------------------------ datasets


def create(spec: dict[str, Any]):
    """The dataset a spec names: {"name", "config"} (the composite's config lists its datasets)."""
    import reasoning_gym

    cfg = dict(spec["config"])
    if spec["name"] != "composite":
        return reasoning_gym.create_dataset(spec["name"], **cfg)
    from reasoning_gym.composite import CompositeConfig, CompositeDataset, DatasetSpec

    subs = [DatasetSpec(d["name"], float(d["weight"]), dict(d["config"])) for d in cfg.pop("datasets")]
    return CompositeDataset(CompositeConfig(datasets=subs, **cfg))


@functools.lru_cache(maxsize=CACHE_SIZE)
def dataset_for(spec_json: str):
    """The dataset of a row's `rg_spec`, built once per process and spec."""
    return create(json.loads(spec_json))


# -------------------------------------------------------------------------------------------------- the worker


def result(value: Any) -> float | str:
    """What a scorer returned, as the reply carries it: a finite number, or "nonfinite" / "error". NaN never
    becomes a score (a NaN compares false with every bound a caller might check)."""
    if not isinstance(value, numbers.Real):  # bool and numpy's numbers are Real; a string is not
        return "error"
    try:
        v = float(value)
    except (OverflowError, TypeError, ValueError):  # an int past a float's range
        return "nonfinite"
    return v if math.isfinite(v) else "nonfinite"


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None  # a .py path always gets a source loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _table(req: dict) -> list:
    """(dataset, entry) per row, or None where the dataset could not be built (its rows are errors)."""
    built: list = []
    for spec in req["specs"]:
        try:
            built.append(dataset_for(spec))
        except Exception:  # noqa: BLE001 - reasoning-gym refusing a spec fails that spec's rows, not the worker
            built.append(None)
    return [(built[k], loads_entry(entry)) if built[k] is not None else None for k, entry, _ in req["rows"]]


def _score(table: list, key: str, answer: str) -> float | str:
    """In the forked child: one row's score (`key` is its index; `_run` hands each row over as [key, answer])."""
    got = table[int(key)]
    if got is None:
        return "error"
    dataset, entry = got
    return result(dataset.score_answer(answer, entry))


def _run(loop, req: dict, cpu_s: int) -> dict:
    items = [[str(i), str(answer)] for i, (_, _, answer) in enumerate(req["rows"])]
    check = functools.partial(_score, _table(req))
    return loop._run(check, {"items": items, "timeout": req["timeout"], "budget": req["budget"]}, cpu_s)


def main() -> None:
    here = Path(__file__).resolve().parent
    base = _load("_posttrain_regex_worker", here.parent / "_regex_worker.py")
    loop = _load("_posttrain_math_worker", here.parent / "rewards" / "_math_worker.py")
    parent, memory_bytes, cpu_s = (int(x) for x in sys.argv[1:4])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the trainer; it closes our stdin when it exits
    replies = os.fdopen(os.dup(1), "w")  # the only channel to the pool
    os.dup2(2, 1)  # what anything else prints (a scorer, a dataset's build) goes where stderr goes: nowhere
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):  # numpy's pools: one thread, and
        os.environ[var] = "1"  # no per-thread buffers against the address-space limit
    import reasoning_gym  # noqa: F401 - imported once, before the limits and the forks

    base._limit(memory_bytes, cpu_s)
    gc.freeze()  # what is imported stays shared with every child (no copy-on-write of the heap per fork)

    def reply(obj: dict) -> None:
        replies.write(json.dumps(obj) + "\n")
        replies.flush()

    replies.write("ready\n")
    replies.flush()
    while True:
        line = base._next_request(parent)
        if not line:
            return
        try:
            out = _run(loop, json.loads(line), cpu_s)
        except MemoryError:
            reply({"error": "memory"})
            return
        reply(out)


if __name__ == "__main__":
    main()
