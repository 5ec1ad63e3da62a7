"""The README's configuration table lists every config key (scripts/config_reference.py regenerates it)."""

import re
from pathlib import Path

from posttrain.config.schema import Config

ROOT = Path(__file__).resolve().parents[2]


def _keys(model, prefix=""):
    from pydantic import BaseModel

    for name, f in model.model_fields.items():
        if isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel):
            yield from _keys(f.annotation, f"{prefix}{name}.")
        else:
            yield prefix + name


def test_readme_lists_every_config_key():
    readme = (ROOT / "README.md").read_text()
    sections = tuple(f"{s}." for s in Config.model_fields)
    listed = {k for k in re.findall(r"^\| `([a-z_.]+)` \|", readme, flags=re.M) if k.startswith(sections)}
    missing = sorted(set(_keys(Config)) - listed)
    stale = sorted(listed - set(_keys(Config)))
    assert not missing and not stale, f"README config table: missing {missing}, stale {stale} " \
                                      "(regenerate: python scripts/config_reference.py --update)"


def test_readme_table_is_exactly_the_generated_one():
    """Not only the keys: every default and meaning, one row per key (a default with a newline once split a row
    and a factory default showed as PydanticUndefined)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("config_reference", ROOT / "scripts" / "config_reference.py")
    ref = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ref)
    table = ref.table()
    assert "PydanticUndefined" not in table
    for line in table.splitlines():  # three cells per row: an unescaped | inside a cell would add one
        assert re.sub(r"\\\|", "", line).count("|") == 4, line
    assert table in (ROOT / "README.md").read_text(), "README config table is stale: python scripts/config_reference.py --update"
