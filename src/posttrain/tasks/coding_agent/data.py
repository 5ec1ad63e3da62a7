"""The coding agent's repositories and issues.

Two kinds of issue, one row each:
  deletion  the feature-deletion repos (tasks/data/repos/): one function's body replaced by
            `raise NotImplementedError` (tasks/feature_deletion.py finds and deletes them with `ast`)
  bug       repos written for this task (data/repos/), each a few modules whose tests pass, with one seeded bug
            per issue (data/bugs.json: the correct and the buggy text of each edit). The issue text describes
            the symptom where a user sees it, and the bug sits in another module, so fixing it takes reading
            more than one file.

An Issue holds the starting sources (what the agent gets) and the edits that undo the damage (what the
demonstrator writes). Pristine tests are never part of an issue: `pristine_tests` reads the packaged files.
"""

from __future__ import annotations

import functools
import json
import textwrap
from dataclasses import dataclass
from pathlib import Path

from posttrain.tasks import feature_deletion as fd
from posttrain.tasks.coding_agent.repo import is_test_path, occurrences

DATA = Path(__file__).parent / "data"
BUG_REPOS = DATA / "repos"
KINDS = ("deletion", "bug")


@dataclass(frozen=True)
class Issue:
    kind: str  # deletion | bug
    repo: str
    id: str
    text: str  # the issue as the agent reads it
    sources: dict[str, str]  # the starting state: every non-test file, with the deletion or the bug
    fix: tuple[dict[str, str], ...]  # edit_file arguments {path, old, new} that resolve it, in order


def repo_names(kind: str) -> list[str]:
    if kind == "deletion":
        return fd.repo_names()
    if kind == "bug":
        return sorted(p.name for p in BUG_REPOS.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))
    raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")


@functools.lru_cache(maxsize=32)
def _load(kind: str, name: str) -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]:
    # Read here, not through feature_deletion's cache, whose dicts any caller could change.
    if name not in repo_names(kind):
        raise ValueError(f"unknown {kind} repo {name!r}; shipped: {repo_names(kind)}")
    root = (fd.REPOS if kind == "deletion" else BUG_REPOS) / name
    sources, tests = [], []
    for p in sorted(root.rglob("*.py")):  # Python files only, as the grader runs its own ini and no conftest
        if "__pycache__" not in p.parts:
            rel = p.relative_to(root).as_posix()
            (tests if is_test_path(rel) else sources).append((rel, p.read_text()))
    return tuple(sources), tuple(tests)


def load_repo(kind: str, name: str) -> tuple[dict[str, str], dict[str, str]]:
    """(sources, tests) of a packaged repo as it is on disk (tests pass), fresh dicts every call: the cache
    behind them is immutable, so no caller can change what the next one, or the grader, reads."""
    sources, tests = _load(kind, name)
    return dict(sources), dict(tests)


def pristine_tests(kind: str, name: str) -> dict[str, str]:
    """The test files that grade `name`, read from the package: never from an episode's copy."""
    return load_repo(kind, name)[1]


@functools.lru_cache(maxsize=1)
def _bug_specs() -> dict[str, list[dict]]:
    return json.loads((DATA / "bugs.json").read_text())


def bug_issues(repo: str) -> list[Issue]:
    """One Issue per seeded bug of `repo`. Each edit's correct text must occur once in the correct file and its
    buggy text once in the buggy one, so the demonstrator's string replace is exact."""
    correct, _ = load_repo("bug", repo)
    out = []
    for spec in _bug_specs().get(repo, []):
        files, fix = dict(correct), []
        for e in spec["edits"]:
            path, good, bad = e["path"], e["correct"], e["buggy"]
            if len(occurrences(files[path], good)) != 1:
                raise ValueError(f"bugs.json {repo}:{spec['id']}: the correct text must occur once in {path}")
            files[path] = files[path].replace(good, bad)
            if len(occurrences(files[path], bad)) != 1:
                raise ValueError(f"bugs.json {repo}:{spec['id']}: the buggy text must occur once in {path}")
            fix.append({"path": path, "old": bad, "new": good})
        out.append(Issue("bug", repo, spec["id"], spec["issue"], files, tuple(fix)))
    return out


def deletion_issues(repo: str) -> list[Issue]:
    """One Issue per deletable function of a feature-deletion repo; the fix puts the original function back in
    place of the stubbed one (the whole function, from its first line to the stub)."""
    out = []
    for row, ref in fd.make_rows(repo):
        path, qualname = row["path"], row["qualname"]
        stub_source = row["files"][path]
        site = next(s for s in fd.function_sites(stub_source) if s.qualname == qualname)
        old = "".join(stub_source.splitlines(keepends=True)[site.start - 1 : site.end])
        new = textwrap.indent(ref, " " * site.indent)
        if len(occurrences(stub_source, old)) != 1:
            raise ValueError(f"{repo}:{qualname}: the stubbed function is not unique in {path}")
        text = (
            f"`{qualname}` in `{path}` raises NotImplementedError: its body is missing. Implement it so the "
            "repository's tests pass; its docstring says what it does."
        )
        sources = {p: t for p, t in row["files"].items() if not is_test_path(p)}
        out.append(Issue("deletion", repo, qualname, text, sources, ({"path": path, "old": old, "new": new},)))
    return out


def issues(kind: str, repo: str) -> list[Issue]:
    return deletion_issues(repo) if kind == "deletion" else bug_issues(repo)
