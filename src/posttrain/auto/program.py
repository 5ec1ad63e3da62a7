"""program.md: what `posttrain auto` may change, toward what goal, within what budget.

A program is markdown for people with one fenced ```yaml block for the machine:

    goal: raise the held-out exact-JSON pass rate
    metric: eval/pass_rate          # a key of summary.json's "after" (or a top-level summary key, or a train metric)
    direction: max                  # max | min
    budget:
      trial: {steps: 15, seconds: 180, timeout_s: 420}   # loop.steps, loop.time_budget_s, wall-clock kill
      total: {trials: 12, minutes: 60}                   # candidate trials after the baseline; whole search
    seeds: [0, 1]                   # seed 1 for every trial; seed 2 for the baseline and to confirm a winner
    noise: 0.02                     # the least spread assumed between seeds (a floor under the measured one)
    search:
      trainer.lr: {low: 5.0e-6, high: 1.0e-4, log: true}
      loop.prompts_per_step: {low: 2, high: 8}           # ints when both bounds are ints
      algorithm.name: {choices: [grpo, dr_grpo, rloo]}
    frozen: [model.name, task.name]  # the search (and an LLM proposer) must never change these
    set: {loop.eval_every: 5}        # fixed overrides for every trial, baseline included
    proposer: optuna                 # or {kind: llm, base_url: ..., model: ..., api_key_env: OPENAI_API_KEY}
    pruning: true                    # stop a trial whose intermediate held-out evals fall below the median
    parallel: 1                      # 2: a trial's two seeds run at once (one process each; set model.threads)

`load_program` parses and validates it against the config schema: an unknown key names the nearest valid one, a
searched key that is frozen is refused, and every bound (and choice) must be a value the schema accepts.
"""

from __future__ import annotations

import copy
import difflib
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from posttrain.config.load import ConfigError, apply_override, validate
from posttrain.config.schema import Config
from posttrain.errors import PosttrainError

FENCE = re.compile(r"^```ya?ml[^\n]*\n(.*?)^```", re.S | re.M)
TOP_KEYS = [
    "goal",
    "metric",
    "direction",
    "budget",
    "seeds",
    "noise",
    "search",
    "frozen",
    "set",
    "proposer",
    "pruning",
    "parallel",
]
# Set by `posttrain auto` for every trial: never searched.
MANAGED = {"run.name": "the trial's name", "run.output_dir": "the search directory", "run.seed": "seeds:"}


class ProgramError(PosttrainError, ValueError):
    """A program.md problem, with a message that names the key and what is expected."""


@dataclass
class Param:
    """One searched config key: a float (linear or log) or int range, or a list of choices."""

    key: str
    kind: str  # float | int | categorical
    low: float | None = None
    high: float | None = None
    log: bool = False
    choices: list[Any] = field(default_factory=list)

    def contains(self, v: Any) -> bool:
        if self.kind == "categorical":
            return v in self.choices
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            return False
        if self.kind == "int" and int(v) != v:
            return False
        low, high = self.bounds()
        return low <= v <= high

    def bounds(self) -> tuple[float, float]:
        """A range's (low, high): _param sets both for every float and int param."""
        assert self.low is not None and self.high is not None, f"search.{self.key}: a {self.kind} range without bounds"
        return self.low, self.high

    def coerce(self, v: Any) -> Any:
        if self.kind == "int" and isinstance(v, float) and v.is_integer():
            return int(v)
        if self.kind == "float" and isinstance(v, int) and not isinstance(v, bool):
            return float(v)
        return v

    def describe(self) -> str:
        if self.kind == "categorical":
            return f"one of {self.choices}"
        return f"{self.kind} in [{self.low:g}, {self.high:g}]" + (" (log scale)" if self.log else "")


@dataclass
class Program:
    path: Path
    text: str
    goal: str
    metric: str
    direction: str
    search: dict[str, Param]
    frozen: list[str] = field(default_factory=list)
    set: dict[str, Any] = field(default_factory=dict)
    steps: int | None = None
    seconds: float | None = None
    timeout_s: float = 3600.0
    total_trials: int | None = None
    total_minutes: float | None = None
    seeds: list[int] = field(default_factory=lambda: [0, 1])
    noise: float = 0.0
    proposer: dict[str, Any] = field(default_factory=lambda: {"kind": "optuna"})
    pruning: bool = True
    parallel: int = 1  # seed runs of one trial at the same time (1: one after another; 2: both seeds at once)

    def trial_overrides(self) -> list[str]:
        """The overrides every trial gets besides its params: `set:` and the per-trial budget."""
        out = [f"{k}={fmt_value(v)}" for k, v in self.set.items()]
        if self.steps is not None:
            out.append(f"loop.steps={self.steps}")
        if self.seconds is not None:
            out.append(f"loop.time_budget_s={self.seconds}")
        return out


def fmt_value(v: Any) -> str:
    """A value as the right-hand side of a `key=value` override (JSON is YAML: strings stay strings)."""
    return json.dumps(v)


def load_program(path: str | Path, base_config: str | Path | None = None) -> Program:
    p = Path(path)
    if not p.exists():
        raise ProgramError(f"program file not found: {p}")
    text = p.read_text()
    blocks = FENCE.findall(text)
    if not blocks:
        raise ProgramError(f"{p} has no ```yaml block (the machine-readable part: metric, budget, search, frozen)")
    if len(blocks) > 1:
        raise ProgramError(f"{p} has {len(blocks)} ```yaml blocks; put the whole program in one")
    try:
        data = yaml.safe_load(blocks[0]) or {}
    except yaml.YAMLError as e:
        raise ProgramError(f"the ```yaml block of {p} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ProgramError(f"the ```yaml block of {p} must be a mapping (goal:, metric:, search:, ...)")
    prog = _parse(p, text, data)
    validate_program(prog, base_data(base_config))
    return prog


def base_data(base_config: str | Path | None) -> dict[str, Any]:
    if base_config is None:
        return {}
    b = Path(base_config)
    if not b.exists():
        raise ProgramError(f"base config not found: {b}")
    try:
        data = yaml.safe_load(b.read_text()) or {}
    except yaml.YAMLError as e:
        raise ProgramError(f"{b} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ProgramError(f"{b} must hold a mapping of sections (run:, model:, ...)")
    return data


def _parse(path: Path, text: str, d: dict[str, Any]) -> Program:
    for k in d:
        if k not in TOP_KEYS:
            raise ProgramError(f"program: unknown key {k!r}{_hint(k, TOP_KEYS)} (valid: {', '.join(TOP_KEYS)})")
    for k in ("metric", "search"):
        if k not in d:
            raise ProgramError(f"program: {k!r} is required")
    direction = str(d.get("direction", "max"))
    if direction not in ("max", "min"):
        raise ProgramError(f"program: direction must be max or min, got {direction!r}")
    if not isinstance(d["search"], dict) or not d["search"]:
        raise ProgramError(
            "program: search must map dotted config keys to ranges, e.g. "
            "trainer.lr: {low: 1.0e-6, high: 1.0e-4, log: true}"
        )
    budget = d.get("budget") or {}
    if not isinstance(budget, dict) or set(budget) - {"trial", "total"}:
        raise ProgramError("program: budget takes trial: {steps, seconds, timeout_s} and total: {trials, minutes}")
    trial, total = budget.get("trial") or {}, budget.get("total") or {}
    for name, sub, keys in (
        ("budget.trial", trial, {"steps", "seconds", "timeout_s"}),
        ("budget.total", total, {"trials", "minutes"}),
    ):
        extra = set(sub) - keys
        if extra:
            k = sorted(extra)[0]
            raise ProgramError(
                f"program: unknown key '{name}.{k}'{_hint(k, sorted(keys))} (valid: {', '.join(sorted(keys))})"
            )
    if not total:
        raise ProgramError(
            "program: budget.total needs trials and/or minutes (a search without a total budget never ends)"
        )
    seconds = _num(trial.get("seconds"), "budget.trial.seconds")
    timeout = _num(trial.get("timeout_s"), "budget.trial.timeout_s")
    if timeout is None:
        timeout = max(2 * seconds, seconds + 300) if seconds else 3600.0
    seeds = d.get("seeds", [0, 1])
    if not (
        isinstance(seeds, list) and len(seeds) == 2 and all(isinstance(s, int) for s in seeds) and seeds[0] != seeds[1]
    ):
        raise ProgramError(f"program: seeds must be two different integers, got {seeds!r}")
    proposer = d.get("proposer", "optuna")
    proposer = {"kind": proposer} if isinstance(proposer, str) else dict(proposer)
    if proposer.get("kind") not in ("optuna", "llm"):
        raise ProgramError(
            f"program: proposer must be optuna or llm (or {{kind: llm, base_url: ...}}), got {proposer.get('kind')!r}"
        )
    if proposer["kind"] == "llm" and not proposer.get("model"):
        raise ProgramError("program: proposer kind llm needs model: (and base_url: for a non-OpenAI endpoint)")
    frozen = d.get("frozen") or []
    if not isinstance(frozen, list):
        raise ProgramError("program: frozen must be a list of dotted config keys")
    sets = d.get("set") or {}
    if not isinstance(sets, dict):
        raise ProgramError("program: set must map dotted config keys to values")
    steps = trial.get("steps")
    if steps is not None and (not isinstance(steps, int) or steps < 1):
        raise ProgramError(f"program: budget.trial.steps must be a positive integer, got {steps!r}")
    parallel = d.get("parallel", 1)
    if isinstance(parallel, bool) or parallel not in (1, 2):
        raise ProgramError(
            f"program: parallel must be 1 (a trial's seeds one after another) or 2 (both at once), got {parallel!r}"
        )
    trials = total.get("trials")
    if trials is not None and (not isinstance(trials, int) or trials < 0):
        raise ProgramError(f"program: budget.total.trials must be a non-negative integer, got {trials!r}")
    return Program(
        path=path,
        text=text,
        goal=str(d.get("goal", "")),
        metric=str(d["metric"]),
        direction=direction,
        search={k: _param(k, v) for k, v in d["search"].items()},
        frozen=[str(k) for k in frozen],
        set=dict(sets),
        steps=steps,
        seconds=seconds,
        timeout_s=timeout,
        total_trials=trials,
        total_minutes=_num(total.get("minutes"), "budget.total.minutes"),
        seeds=list(seeds),
        noise=_num(d.get("noise", 0.0), "noise") or 0.0,
        proposer=proposer,
        pruning=bool(d.get("pruning", True)),
        parallel=parallel,
    )


def _num(v: Any, name: str) -> float | None:
    if v is None:
        return None
    try:
        f = float(v)  # YAML 1.1 reads 1e-5 (no dot) as a string
    except (TypeError, ValueError):
        raise ProgramError(f"program: {name} must be a number, got {v!r}") from None
    if not math.isfinite(f) or f < 0:
        raise ProgramError(f"program: {name} must be a finite number >= 0, got {v!r}")
    return f


def _param(key: str, spec: Any) -> Param:
    if isinstance(spec, list):
        spec = {"choices": spec}
    if not isinstance(spec, dict):
        raise ProgramError(
            f"search.{key}: give {{low:, high:}} (add log: true for a log scale) or {{choices: [...]}}, got {spec!r}"
        )
    extra = set(spec) - {"low", "high", "log", "choices", "type"}
    if extra:
        raise ProgramError(f"search.{key}: unknown field(s) {sorted(extra)} (valid: low, high, log, type, choices)")
    if "choices" in spec:
        ch = spec["choices"]
        if (
            not isinstance(ch, list)
            or not ch
            or any(not (c is None or isinstance(c, (bool, int, float, str))) for c in ch)
        ):
            raise ProgramError(f"search.{key}: choices must be a non-empty list of plain values, got {ch!r}")
        return Param(key, "categorical", choices=list(ch))
    if "low" not in spec or "high" not in spec:
        raise ProgramError(f"search.{key}: a range needs both low and high")
    raw = (spec["low"], spec["high"])
    kind = spec.get("type") or ("int" if all(isinstance(x, int) and not isinstance(x, bool) for x in raw) else "float")
    if kind not in ("int", "float"):
        raise ProgramError(f"search.{key}: type must be int or float, got {kind!r}")
    lo, hi = (float(_num_any(x, key)) for x in raw)
    if kind == "int":
        if not (lo.is_integer() and hi.is_integer()):
            raise ProgramError(f"search.{key}: an int range needs integer bounds, got {raw}")
        lo, hi = int(lo), int(hi)
    if lo >= hi:
        raise ProgramError(f"search.{key}: low ({lo}) must be below high ({hi})")
    log = bool(spec.get("log", False))
    if log and lo <= 0:
        raise ProgramError(f"search.{key}: a log range needs low > 0, got {lo}")
    return Param(key, kind, lo, hi, log)


def _num_any(x: Any, key: str) -> float:
    try:
        f = float(x)
    except (TypeError, ValueError):
        raise ProgramError(f"search.{key}: bounds must be numbers, got {x!r}") from None
    if not math.isfinite(f):
        raise ProgramError(f"search.{key}: bounds must be finite, got {x!r}")
    return f


# ---- validation against the config schema ----------------------------------------------------------------


def config_keys(model: type[BaseModel] = Config, prefix: str = "") -> list[str]:
    """Every dotted leaf key of the schema (sections recursed)."""
    out = []
    for name, f in model.model_fields.items():
        ann = f.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out += config_keys(ann, f"{prefix}{name}.")
        else:
            out.append(prefix + name)
    return out


def check_key(key: str, where: str) -> None:
    """Raise ProgramError unless `key` is a settable dotted key of the schema (task.options.* is free-form)."""
    model: type[BaseModel] = Config
    parts = key.split(".")
    for i, part in enumerate(parts):
        f = model.model_fields.get(part)
        if f is None:
            valid = config_keys()
            raise ProgramError(f"{where}: unknown config key '{key}'{_hint(key, valid, dotted=True)}")
        ann = f.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            if i == len(parts) - 1:
                raise ProgramError(
                    f"{where}: '{key}' is a section, not a value (e.g. '{key}.{next(iter(ann.model_fields))}')"
                )
            model = ann
            continue
        if i < len(parts) - 1 and not (ann is dict or getattr(ann, "__origin__", None) is dict):
            raise ProgramError(f"{where}: '{'.'.join(parts[: i + 1])}' is a value, not a section (in '{key}')")
        return


def validate_program(prog: Program, base: dict[str, Any]) -> None:
    for k in prog.frozen:
        check_key(k, "frozen")
    for k in prog.set:
        check_key(k, "set")
        if k in prog.search:
            raise ProgramError(f"set: '{k}' is also in search; a key is either fixed or searched")
    budget_keys = {"loop.steps": prog.steps, "loop.time_budget_s": prog.seconds}
    for k in prog.search:
        check_key(k, "search")
        if k in prog.frozen or any(k.startswith(f + ".") for f in prog.frozen):
            raise ProgramError(
                f"search: '{k}' is frozen (listed under frozen:); a frozen key may not be searched. "
                f"Remove it from search: or from frozen:"
            )
        if k in MANAGED:
            raise ProgramError(f"search: '{k}' is set by posttrain auto ({MANAGED[k]}); it cannot be searched")
        if budget_keys.get(k) is not None:
            raise ProgramError(f"search: '{k}' is set by budget.trial; remove one of them")
    for k in prog.set:
        if k in MANAGED:
            raise ProgramError(f"set: '{k}' is set by posttrain auto ({MANAGED[k]})")
    fixed = copy.deepcopy(base)
    try:
        for ov in prog.trial_overrides():
            apply_override(fixed, ov)
        validate(fixed)
    except ConfigError as e:
        raise ProgramError(f"the base config with set: and budget.trial is not a valid config: {e}") from None
    for k, p in prog.search.items():
        values = p.choices if p.kind == "categorical" else [p.low, p.high]
        for v in values:
            d = copy.deepcopy(fixed)
            apply_override(d, f"{k}={fmt_value(v)}")
            try:
                validate(d)
            except ConfigError as e:
                what = "choice" if p.kind == "categorical" else ("low" if v == p.low else "high")
                msg = str(e).removeprefix("invalid config:\n  ")
                raise ProgramError(
                    f"search: {k} {what}={v!r} is outside what the config schema accepts: {msg}"
                ) from None


def base_params(prog: Program, base: dict[str, Any]) -> dict[str, Any]:
    """The searched keys' values in the base config (with set: and the trial budget applied)."""
    d = copy.deepcopy(base)
    for ov in prog.trial_overrides():
        apply_override(d, ov)
    dumped = validate(d).model_dump(mode="json")
    out = {}
    for k in prog.search:
        node: Any = dumped
        for part in k.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        out[k] = node
    return out


def _hint(name: str, valid: list[str], dotted: bool = False) -> str:
    near = difflib.get_close_matches(name, valid, n=1, cutoff=0.5 if not dotted else 0.6)
    if not near and dotted:  # match on the last part: trainer.learning_rate -> trainer.lr is too far; lr_rate -> lr
        last = name.split(".")[-1]
        cands = {k.split(".")[-1]: k for k in valid if k.split(".")[0] == name.split(".")[0]}
        m = difflib.get_close_matches(last, list(cands), n=1, cutoff=0.5)
        near = [cands[m[0]]] if m else []
    return f"; did you mean '{near[0]}'?" if near else ""
