"""Load a Config from YAML plus `a.b.c=value` overrides, with errors a person can act on."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from posttrain.bounded_files import open_regular, read_capped
from posttrain.config.schema import Config
from posttrain.config.task_options import describe
from posttrain.errors import PosttrainError

MAX_CONFIG_BYTES = 1 << 20  # a config file is a few kilobytes; a run's config.yaml with every key, about ten


class ConfigError(PosttrainError, ValueError):
    """A config problem, with a message that names the key and what is expected."""


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        try:
            loaded = yaml.safe_load(_read_config(p))
        except yaml.YAMLError as e:
            raise ConfigError(f"{p} is not valid YAML: {e}") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{p} must hold a mapping of sections (run:, model:, ...), got {type(loaded).__name__}")
        data = loaded
    file_algo = dict(data.get("algorithm") or {}) if isinstance(data.get("algorithm"), dict) else {}
    for ov in overrides or []:
        apply_override(data, ov)
    _reset_preset_fields(data, file_algo, overrides or [])
    return validate(data)


def _read_config(p: Path) -> str:
    """The config file's text: a regular file of at most MAX_CONFIG_BYTES, or a ConfigError saying what it is (a
    FIFO is refused, never waited on; a symlink loop is named as one)."""
    if not p.exists() and not p.is_symlink():
        raise ConfigError(f"config file not found: {p}")
    err = lambda m: ConfigError(f"config file {m}")
    with open_regular(p, err) as f:
        data = read_capped(f, p, err, MAX_CONFIG_BYTES, "; a config is a few kilobytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"config file {p}: not UTF-8 text (byte {e.start + 1})") from None


def _reset_preset_fields(data: dict[str, Any], file_algo: dict[str, Any], overrides: list[str]) -> None:
    """`algorithm.name=X` on the command line over a file that names another algorithm: the fields a preset sets,
    where only the file set them, are dropped so that X's preset (or the default) fills them. A written-out config
    (configs/json_extract.yaml: every field explicit) would otherwise keep the file's advantage and aggregation, and
    `algorithm.name=dr_grpo` would silently change nothing but the name. Fields set on the command line still win."""
    from posttrain.config.schema import ALGORITHM_PRESETS

    cli_keys = {ov.split("=", 1)[0].strip() for ov in overrides if "=" in ov}
    algo = data.get("algorithm")
    if "algorithm.name" not in cli_keys or not isinstance(algo, dict):
        return
    if algo.get("name") == file_algo.get("name", "grpo"):
        return
    controlled = {k for preset in ALGORITHM_PRESETS.values() for k in preset}
    for k in controlled:
        if k in file_algo and f"algorithm.{k}" not in cli_keys:
            algo.pop(k, None)


def apply_override(data: dict[str, Any], override: str) -> None:
    """Set `a.b.c=value` in a nested dict; the value is parsed as YAML (so lists and bools work)."""
    if "=" not in override:
        raise ConfigError(f"override {override!r} must look like key.path=value (e.g. trainer.lr=2e-5)")
    key, raw = override.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {override!r} has an empty key")
    value = _parse_value(raw)
    node = data
    parts = key.split(".")
    for part in parts[:-1]:
        nxt = node.get(part)
        if nxt is None:
            nxt = node[part] = {}
        if not isinstance(nxt, dict):
            raise ConfigError(f"override {override!r}: {part!r} is a value, not a section")
        node = nxt
    node[parts[-1]] = value


def _parse_value(raw: str) -> Any:
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw
    if isinstance(value, str):
        # YAML 1.1 reads "2e-5" as a string; a user typing it means a number.
        try:
            return float(value) if any(c in value for c in ".eE") else int(value)
        except ValueError:
            return value
    return value


def validate(data: dict[str, Any]) -> Config:
    try:
        return Config.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_explain(e, data)) from None


def _explain(err: ValidationError, data: dict[str, Any]) -> str:
    """Every error on a line of its own; one error on the same line as "invalid config:" (the CLI's one line)."""
    lines = [_line(item) for item in err.errors()]
    if len(lines) == 1:
        return f"invalid config: {lines[0]}"
    return "invalid config:\n  " + "\n  ".join(lines)


def _line(item: Any) -> str:
    loc = [str(x) for x in item["loc"]]
    dotted = ".".join(loc) or "(top level)"
    if item["type"] == "option_error" or any(isinstance(x, int) for x in item["loc"]):
        return describe(item, model=Config)  # a task's options, a list's entry (config/task_options.py)
    if item["type"] == "extra_forbidden":
        valid = _valid_keys(loc[:-1])
        near = difflib.get_close_matches(loc[-1], valid, n=1, cutoff=0.5)
        hint = f"; did you mean '{'.'.join(loc[:-1] + [near[0]])}'?" if near else ""
        return f"unknown key '{dotted}'{hint} (valid keys here: {', '.join(valid)})"
    if item["type"] == "value_error" and not loc:
        return item["msg"].removeprefix("Value error, ")
    if item["type"] in ("literal_error", "union_tag_invalid"):  # the allowed values, and the nearest of them
        return describe(item)
    expected = _expected_type(loc)
    value = item.get("input")
    exp = f" (expected {expected})" if expected else ""
    return f"'{dotted}' = {value!r}: {item['msg']}{exp}"


def _model_at(loc: list[str]) -> type[BaseModel] | None:
    model: type[BaseModel] = Config
    for part in loc:
        field = model.model_fields.get(part)
        if field is None:
            return None
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            model = ann
        else:
            return None
    return model


def _valid_keys(loc: list[str]) -> list[str]:
    model = _model_at(loc)
    return list(model.model_fields) if model else []


def _expected_type(loc: list[str]) -> str | None:
    parent = _model_at(loc[:-1]) if loc else None
    if parent is None or not loc:
        return None
    field = parent.model_fields.get(loc[-1])
    if field is None:
        return None
    ann = field.annotation
    return getattr(ann, "__name__", None) or str(ann).replace("typing.", "")


def to_yaml(cfg: Config) -> str:
    """The resolved config as YAML; settings posttrain derived (Config.derived) are listed on top as comments."""
    head = "".join(f"# derived (you did not set it): {d}\n" for d in cfg.derived)
    return head + yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
