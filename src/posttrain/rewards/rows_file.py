"""Rows from a JSONL file (one JSON object per line) or a .json file holding a list: the data files users bring
(preference pairs, triplets). Errors name the file and line, in the caller's own error type."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_rows(path: Path, error: type[Exception], what: str) -> list[Any]:
    text = path.read_text()
    if path.suffix == ".json":
        rows = json.loads(text)
        if not isinstance(rows, list):
            raise error(f"{path}: a .json {what} file must hold a list of rows")
        return rows
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise error(f"{path}:{n}: not valid JSON: {e}") from None
    return rows
