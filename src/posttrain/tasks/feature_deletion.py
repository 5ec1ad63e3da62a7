"""`feature-deletion`: a function of a small repo lost its body; restore it so the repo's tests pass again.

Composer-style synthetic tasks from working code: take a repo whose tests pass, delete one function body
(`raise NotImplementedError`, the docstring kept, found with `ast`), show the policy the repo's source
files (never the tests) and ask for the function back. One row per deletable function (top-level functions
and methods; dunders stay). The policy's function is spliced in and graded by `grade_pytest` against the
pristine test files, so a solution cannot edit the tests it is graded by. The reward, `issue_tests`, pays the
tests the deletion breaks fixed, times the others kept passing, against each row's baseline (the deleted repo's
own grade, graded up front by Task.prepare and kept only when it came to a verdict: tasks/baselines.py). The
repos (`data/repos/<name>/`, written for this project) are a few modules plus a `tests/` folder and a
`pytest.ini` that puts the repo root on the import path.

Grading is out-of-process wherever the machine allows it (root and a namespaced backend): pytest and the
pristine tests run in one sandboxed process, the spliced repo in another under another uid, reached through
proxies, so the solution cannot reach the process that reports verdicts (docs/sandbox.md).

Rubric: `issue_tests` (weight 1; `reward=tests_passed` pays that instead), `tests_passed` (the fraction of the
repo's tests passed; the pass is 1.0), `grading_trust` (weight 0: 1 out-of-process, 0 in-process,
-1 not graded, so logs show it), `hack_flagged` (weight 0; flagged samples get 0).
"""

from __future__ import annotations

import ast
import asyncio
import functools
import hashlib
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posttrain.aio import run_sync
from posttrain.bounded import BoundedError, parse_python
from posttrain.envs.task import Task
from posttrain.rewards.hack_guard import guard
from posttrain.rewards.repair_grades import Baseline, check_repair_reward, issue_rewards
from posttrain.rewards.rubric import RewardComponent, Rubric
from posttrain.rewards.text import completion_text
from posttrain.tasks.baselines import BaselineStore
from posttrain.tasks.code_tests import all_code, extract_code

REPOS = Path(__file__).parent / "data" / "repos"
STUB = "raise NotImplementedError"
USER = (
    "Here is a small Python repository.\n\n{files}\n\n"
    "The body of `{qualname}` in `{path}` was deleted: it now raises NotImplementedError. Write the complete "
    "function `{name}` again so that the repository works. Reply with only the function definition in a "
    "```python code block."
)


@dataclass(frozen=True)
class Site:
    """Where a function lives in a module: `start` is its first line (decorators included), 1-based."""

    qualname: str
    name: str
    start: int
    end: int
    body_start: int  # first line after the docstring
    indent: int  # column of the `def`


def repo_names() -> list[str]:
    return sorted(p.name for p in REPOS.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))


def is_test_path(rel: str) -> bool:
    parts = rel.split("/")
    return parts[0] == "tests" or parts[-1] in ("conftest.py", "pytest.ini") or parts[-1].startswith("test_")


@functools.lru_cache(maxsize=16)
def load_repo(name: str) -> tuple[dict[str, str], dict[str, str]]:
    """(source files, test files) of a shipped repo, as relative path -> text. Caches are read-only."""
    root = REPOS / name
    if not root.is_dir():
        raise ValueError(f"unknown repo {name!r}; shipped: {repo_names()}")
    sources, tests = {}, {}
    for p in sorted(root.rglob("*")):
        # Python files only: the grader runs pytest with its own ini and no conftest (pytest.ini on disk is for
        # running a repo's tests by hand).
        if p.is_file() and "__pycache__" not in p.parts and p.suffix == ".py":
            rel = p.relative_to(root).as_posix()
            (tests if is_test_path(rel) else sources)[rel] = p.read_text()
    return sources, tests


def function_sites(source: str) -> list[Site]:
    """Deletable functions of a module: top-level functions and methods of top-level classes with a body
    beyond their docstring, dunders excluded (deleting `__init__` breaks everything and teaches nothing)."""
    tree = ast.parse(source)
    sites: list[Site] = []

    def add(fn: ast.FunctionDef | ast.AsyncFunctionDef, prefix: str) -> None:
        if fn.name.startswith("__") and fn.name.endswith("__"):
            return
        body = fn.body
        first = body[0]
        has_doc = (
            isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)
        )
        rest = body[1:] if has_doc else body
        if not rest:
            return
        start = min([fn.lineno] + [d.lineno for d in fn.decorator_list])
        sites.append(Site(prefix + fn.name, fn.name, start, fn.end_lineno or fn.lineno, rest[0].lineno, fn.col_offset))

    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            add(node, "")
        elif isinstance(node, ast.ClassDef):
            for sub in node.body:
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    add(sub, node.name + ".")
    return sites


def delete_body(source: str, site: Site) -> str:
    """`source` with the body of `site` (after its docstring) replaced by `raise NotImplementedError`.
    Line-based, so comments and formatting elsewhere in the file survive (ast.unparse would drop them)."""
    lines = source.splitlines(keepends=True)
    body_indent = " " * (site.indent + 4)
    return "".join(lines[: site.body_start - 1] + [body_indent + STUB + "\n"] + lines[site.end :])


def original_function(source: str, site: Site) -> str:
    """The function's own source, dedented: what a perfect answer looks like."""
    lines = source.splitlines(keepends=True)
    return textwrap.dedent("".join(lines[site.start - 1 : site.end]))


def splice(stub_source: str, qualname: str, code: str) -> str | None:
    """Put the function named like `qualname` from `code` in place of `qualname` in `stub_source`, indented to
    fit (a method written at column 0 goes back into its class). Top-level imports in `code` go after the
    module docstring. None when `code` does not parse or does not define the function."""
    name = qualname.rsplit(".", 1)[-1]
    try:
        tree = parse_python(code)  # model text: size, depth and node caps (a deep expression raised RecursionError)
    except BoundedError:
        return None
    fn = next(
        (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name), None
    )
    if fn is None:
        return None
    code_lines = code.splitlines(keepends=True)
    start = min([fn.lineno] + [d.lineno for d in fn.decorator_list])
    new_fn = textwrap.dedent("".join(code_lines[start - 1 : fn.end_lineno]))
    site = next((s for s in function_sites(stub_source) if s.qualname == qualname), None)
    if site is None:
        return None
    lines = stub_source.splitlines(keepends=True)
    new_fn = textwrap.indent(new_fn, " " * site.indent)
    if not new_fn.endswith("\n"):
        new_fn += "\n"
    out = lines[: site.start - 1] + [new_fn] + lines[site.end :]
    imports = [ast.get_source_segment(code, n) for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    if imports:
        mod = ast.parse(stub_source)
        at = mod.body[0].end_lineno if mod.body and isinstance(mod.body[0], ast.Expr) else 0
        out = out[:at] + [i + "\n" for i in imports if i] + out[at:]
    return "".join(out)


def make_rows(repo: str) -> list[tuple[dict[str, Any], str]]:
    """(row, original function source) for every deletable function of `repo`."""
    sources, _ = load_repo(repo)
    out = []
    for path, text in sources.items():
        if not path.endswith(".py"):
            continue
        for site in function_sites(text):
            files = dict(sources)
            files[path] = delete_body(text, site)
            shown = "\n\n".join(f"### {p}\n```python\n{t.rstrip()}\n```" for p, t in files.items() if p.endswith(".py"))
            user = USER.format(files=shown, qualname=site.qualname, path=path, name=site.name)
            row = {
                "prompt": [{"role": "user", "content": user}],
                "repo": repo,
                "path": path,
                "qualname": site.qualname,
                "files": files,
            }
            out.append((row, original_function(text, site)))
    return out


class PytestGrader:
    """Splices each completion's function into its row's repo and grades all of them in the sandbox."""

    def __init__(self, sandbox: Any = None, mode: str | None = None, **sandbox_options: Any) -> None:
        from posttrain.sandbox import SandboxConfig, SandboxPool

        self.cfg = sandbox if sandbox is not None else SandboxConfig(**{"timeout_s": 20.0, **sandbox_options})
        self.pool = SandboxPool(self.cfg)
        self.mode = mode  # None: out-of-process where the machine allows it (grading.default_mode)
        self.trust: dict[tuple[str, str], str] = {}  # (text, row key) -> GradeResult.trust of the latest grade
        self.last: dict[tuple[str, str], Any] = {}  # (text, row key) -> GradeResult of the latest grade
        # row key -> the deleted (stub) repo's per-test grade: which tests the gap breaks (tasks/baselines.py)
        self.baselines = BaselineStore("feature-deletion", self.cfg, _stub_repo, _key, mode)

    def files_for(self, text: str, row: dict[str, Any]) -> dict[str, str] | None:
        code = extract_code(text, row["qualname"].rsplit(".", 1)[-1])
        new = splice(row["files"][row["path"]], row["qualname"], code) if code else None
        return None if new is None else {**row["files"], row["path"]: new}

    def grade(self, texts: list[str], rows: list[dict[str, Any]]) -> list[Any]:
        """One GradeResult (None where no function could be spliced in) per completion, all at once."""
        files = [self.files_for(t, r) for t, r in zip(texts, rows)]

        async def all_of() -> list[Any]:
            async def one(f: dict[str, str] | None, row: dict[str, Any]) -> Any:
                return None if f is None else await self.pool.grade_pytest(f, load_repo(row["repo"])[1], mode=self.mode)

            return list(await asyncio.gather(*(one(f, r) for f, r in zip(files, rows))))

        results = run_sync(all_of)
        if len(self.trust) > 4096:  # a bounded memo: only the latest batch is read back
            self.trust.clear()
            self.last.clear()
        for t, r, g in zip(texts, rows, results):
            if g is not None:
                self.trust[(t, _key(r))] = g.trust
                self.last[(t, _key(r))] = g
        return results

    def start(self, rows: list[dict[str, Any]]) -> list[Baseline]:
        """Each row's baseline: its repo as given (the function's body deleted), graded to a verdict once per row
        (normally up front by Task.prepare); a row not settled yet gets one try here (BaselineStore.get)."""
        todo = {_key(r): r for r in rows if self.baselines.cached(r) is None}

        async def all_of() -> list[Baseline]:
            return list(await asyncio.gather(*(self.baselines.get(r, self.pool) for r in todo.values())))

        tried = dict(zip(todo, run_sync(all_of))) if todo else {}
        out: list[Baseline] = []
        for r in rows:
            b = tried.get(_key(r)) or self.baselines.cached(r)
            assert b is not None  # a row not settled before was tried just above
            out.append(b)
        return out


def _stub_repo(row: dict[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    """What a row's baseline grades: its repo with the body deleted, against the repo's pristine tests."""
    return row["files"], load_repo(row["repo"])[1]


def deletion_rubric(grader: PytestGrader, detect_hacks: bool = True, reward: str = "issue_tests") -> Rubric:
    """`reward`: issue_tests (default) pays for the tests the deleted body breaks, kept the rest passing
    (rewards/repair_grades.py); tests_passed, the share of all the repo's tests, paid the stub itself for every test
    that does not touch the function. Both are logged."""
    check_repair_reward(reward)

    def tests_passed(
        completions: list[Any],
        repo: list[str],
        path: list[str],
        qualname: list[str],
        files: list[dict[str, str]],
        **kwargs: Any,
    ) -> list[float]:
        rows = [{"repo": r, "path": p, "qualname": q, "files": f} for r, p, q, f in zip(repo, path, qualname, files)]
        results = grader.grade([completion_text(c) for c in completions], rows)
        return [r.score if r is not None else 0.0 for r in results]

    def issue_tests(
        completions: list[Any],
        repo: list[str],
        path: list[str],
        qualname: list[str],
        files: list[dict[str, str]],
        **kwargs: Any,
    ) -> list[float | None]:
        rows = [{"repo": r, "path": p, "qualname": q, "files": f} for r, p, q, f in zip(repo, path, qualname, files)]
        texts = [completion_text(c) for c in completions]
        if any((t, _key(r)) not in grader.last for t, r in zip(texts, rows)):  # tests_passed usually graded them
            grader.grade(texts, rows)
        grades = [grader.last.get((t, _key(r))) for t, r in zip(texts, rows)]
        graded = [r for r, g in zip(rows, grades) if g is not None]  # nothing spliced in: 0, no baseline needed
        starts = iter(grader.start(graded))
        # An unknown baseline fails the sample with the reason while issue_tests is paid (issue_rewards)
        return issue_rewards(
            [(next(starts), g.per_test) if g is not None else None for g in grades], paid=reward == "issue_tests"
        )

    def grading_trust(
        completions: list[Any], repo: list[str], path: list[str], qualname: list[str], **kwargs: Any
    ) -> list[float]:
        out = []
        for c, r, p, q in zip(completions, repo, path, qualname):
            trust = grader.trust.get((completion_text(c), _key({"repo": r, "path": p, "qualname": q})))
            out.append({"out-of-process": 1.0, "in-process": 0.0}.get(trust or "", -1.0))
        return out

    rubric = Rubric(
        [
            RewardComponent("tests_passed", tests_passed, weight=float(reward == "tests_passed"), pass_threshold=1.0),
            RewardComponent("issue_tests", issue_tests, weight=float(reward == "issue_tests"), pass_threshold=1.0),
            RewardComponent("grading_trust", grading_trust, weight=0.0, pass_threshold=0.0),
        ],
        pass_component="tests_passed",
    )
    return guard(rubric, code_of=all_code) if detect_hacks else rubric


def _held_out_keys(rows: list[dict[str, Any]], split_seed: int, eval_fraction: float) -> set[str]:
    """The first `eval_fraction` of rows ordered by a hash of (split_seed, repo, path, qualname)."""
    keys = sorted(_key(r) for r in rows)
    ranked = sorted(keys, key=lambda k: hashlib.sha256(f"{split_seed}:{k}".encode()).hexdigest())
    return set(ranked[: round(len(ranked) * eval_fraction)])


def _key(row: dict[str, Any]) -> str:
    return f"{row['repo']}:{row['path']}:{row['qualname']}"


def make_task(
    seed: int = 0,
    repos: list[str] | None = None,
    eval_fraction: float = 0.2,
    split_seed: int = 0,
    detect_hacks: bool = True,
    sandbox: dict[str, Any] | None = None,
    max_tokens: int = 384,
    grading_mode: str | None = None,
    reward: str = "issue_tests",
) -> Task:
    """The `feature-deletion` task over the shipped repos (or `repos`). Rows are split by function, ordered by
    a hash of (split_seed, repo, path, qualname): deterministic and independent of file order. `grading_mode`
    "out-of-process" or "in-process" forces one (None: out-of-process where the machine allows it)."""
    del seed
    pairs = [pr for r in (repos or repo_names()) for pr in make_rows(r)]
    held_keys = _held_out_keys([r for r, _ in pairs], split_seed, eval_fraction)
    train = [(row, ref) for row, ref in pairs if _key(row) not in held_keys]
    held = [(row, ref) for row, ref in pairs if _key(row) in held_keys]
    grader = PytestGrader(mode=grading_mode, **(sandbox or {}))
    task = Task(
        name="feature-deletion",
        train_rows=[r for r, _ in train],
        eval_rows=[r for r, _ in held],
        rubric=deletion_rubric(grader, detect_hacks, reward),
        description=f"Restore a deleted function body in a small repo ({len(train)} train / {len(held)} "
        "held-out functions); reward = "
        + (
            "the tests the deletion breaks, fixed, the rest kept passing"
            if reward == "issue_tests"
            else "fraction of the repo's tests passed"
        )
        + ".",
        max_tokens=max_tokens,
        stop=["\n```\n"],
        prepare=grader.baselines.prepare,
    )
    from posttrain.envs.smoke_checks import SmokeCheck

    row, ref = train[0]
    stub = original_function(
        row["files"][row["path"]],
        next(s for s in function_sites(row["files"][row["path"]]) if s.qualname == row["qualname"]),
    )
    task.smoke_checks = [
        SmokeCheck(
            f"restored {row['repo']}:{row['qualname']}", row=row, completion=f"```python\n{ref}```", expect="pass"
        ),
        SmokeCheck(
            f"left deleted {row['repo']}:{row['qualname']}", row=row, completion=f"```python\n{stub}```", expect="fail"
        ),
    ]
    references = {(r["repo"], r["path"], r["qualname"]): ref for r, ref in pairs}
    task.references = references  # pyright: ignore[reportAttributeAccessIssue]  # not a Task field; tests read it
    return task
