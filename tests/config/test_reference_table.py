"""The configuration reference page (docs/reference/config.md) lists every config key and is exactly what
scripts/config_reference.py generates from the schema."""

import importlib.util
import re
from pathlib import Path

from posttrain.config import Config

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "reference" / "config.md"
REGEN = "regenerate: python scripts/config_reference.py --update"


def _keys(model, prefix=""):
    from pydantic import BaseModel

    for name, f in model.model_fields.items():
        if isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel):
            yield from _keys(f.annotation, f"{prefix}{name}.")
        else:
            yield prefix + name


def _ref():
    spec = importlib.util.spec_from_file_location("config_reference", ROOT / "scripts" / "config_reference.py")
    ref = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ref)
    return ref


def test_config_page_lists_every_config_key():
    text = PAGE.read_text()
    sections = tuple(f"{s}." for s in Config.model_fields)
    listed = {k for k in re.findall(r"^\| `([a-z_.]+)` \|", text, flags=re.M) if k.startswith(sections)}
    missing = sorted(set(_keys(Config)) - listed)
    stale = sorted(listed - set(_keys(Config)))
    assert not missing and not stale, f"{PAGE.name}: missing {missing}, stale {stale} ({REGEN})"


def test_config_page_is_exactly_the_generated_one():
    """Not only the keys: every default and meaning, one row per key (a default with a newline once split a row
    and a factory default showed as PydanticUndefined)."""
    ref = _ref()
    table = ref.table()
    assert "PydanticUndefined" not in table
    for line in table.splitlines():  # three cells per row: an unescaped | inside a cell would add one
        assert re.sub(r"\\\|", "", line).count("|") == 4, line
    assert PAGE.read_text() == ref.page(), f"{PAGE.relative_to(ROOT)} is stale: {REGEN}"


def test_readme_points_to_the_config_page():
    readme = (ROOT / "README.md").read_text()
    assert "docs/reference/config.md" in readme
    assert "| `run.seed` |" not in readme, "the generated table lives in docs/reference/config.md, not the README"
