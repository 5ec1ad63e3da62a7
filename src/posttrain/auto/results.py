"""A search's results table (results.tsv in its directory: one row per trial), read back by the search when it
resumes and by its report."""

from __future__ import annotations

from pathlib import Path

RESULTS = "results.tsv"


def read_results(search_dir: str | Path) -> list[dict[str, str]]:
    p = Path(search_dir) / RESULTS
    if not p.exists():
        return []
    lines = p.read_text().splitlines()
    if not lines:
        return []
    head = lines[0].split("\t")
    return [dict(zip(head, ln.split("\t"))) for ln in lines[1:] if ln.strip()]
