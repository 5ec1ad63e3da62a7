"""Print the README's configuration table from the pydantic schema (so the README cannot drift):

    python scripts/config_reference.py > /tmp/table.md
"""

from __future__ import annotations

import typing

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
        default = f.default
        if isinstance(default, list) and len(default) > 4:
            default = "[" + ", ".join(default[:3]) + ", ...]"
        out.append((prefix + name, f"`{default}`", desc.replace("|", "\\|")))
    return out


def table() -> str:
    lines = ["| key | default | meaning |", "|---|---|---|"]
    for section, f in Config.model_fields.items():
        lines += [f"| `{k}` | {d} | {m} |" for k, d, m in rows(f.annotation, f"{section}.")]
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
