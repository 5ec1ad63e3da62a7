"""The README's configuration table, generated from the pydantic schema (so the README cannot drift):

    python scripts/config_reference.py            # print it
    python scripts/config_reference.py --update   # rewrite the table in README.md in place
"""

from __future__ import annotations

import sys
import typing
from pathlib import Path

from pydantic import BaseModel

from posttrain.config.schema import Config


def rows(model: type[BaseModel], prefix: str = "") -> list[tuple[str, str, str]]:
    out = []
    for name, f in model.model_fields.items():
        ann = f.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out += rows(ann, f"{prefix}{name}.")
            continue
        desc = f.description or ""
        if typing.get_origin(ann) is typing.Literal and "one of" not in desc:
            desc = (desc + "; " if desc else "") + "one of " + ", ".join(map(str, typing.get_args(ann)))
        default = f.get_default(call_default_factory=True)
        if isinstance(default, list) and len(default) > 4:
            default = "[" + ", ".join(map(str, default[:3])) + ", ...]"
        # A default with a newline (a template) would end the table row: show it escaped, as YAML would need it.
        shown = str(default).replace("\n", "\\n").replace("|", "\\|").replace("`", "'")
        out.append((prefix + name, f"`{shown}`", desc.replace("|", "\\|")))
    return out


def table() -> str:
    lines = ["| key | default | meaning |", "|---|---|---|"]
    for section, f in Config.model_fields.items():
        lines += [f"| `{k}` | {d} | {m} |" for k, d, m in rows(f.annotation, f"{section}.")]
    return "\n".join(lines)


def update(readme: Path) -> None:
    """Replace everything from the table's header row to the next section heading with the generated table."""
    text = readme.read_text()
    start = text.index("| key | default | meaning |", text.index("## Configuration reference"))
    end = text.index("\n## ", start)
    readme.write_text(text[:start] + table() + "\n" + text[end:])


if __name__ == "__main__":
    if sys.argv[1:] == ["--update"]:
        update(Path(__file__).resolve().parents[1] / "README.md")
    else:
        print(table())
