"""`code-tests`: write one small Python function; the reward is the share of hidden test cases it passes.

The problems (`data/code_problems.json`, written for this project) are short and mostly easy ("return the
sum of a list", "reverse a string", "is n even") so a 135M instruct model gets a nonzero reward from step 0;
a few medium and hard ones leave headroom. Each has a reference solution, an entry point, a signature, one
example call shown in the prompt and 4-8 hidden cases that the prompt never shows.

Split: by problem, deterministic: problems are ordered by a hash of (split_seed, id) and the first
`eval_fraction` of them are held out, so no held-out problem is ever trained on and adding a problem moves
no other problem across the split.

Rubric (the headline pass is `tests_passed` == 1, every hidden case passed):
    tests_passed      1.0   fraction of hidden cases passed, graded in the sandbox, all completions at once
    code_format       0.1   the completion holds a parsable block defining the entry point
    sandbox_isolation 0.0   isolation level of the grading run (see ISOLATION_CODES), so logs show it
    hack_flagged      0.0   `rewards.hack_detector`: a flagged sample gets reward 0 (on by default)
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from posttrain.aio import run_sync
from posttrain.bounded import BoundedError, clip, parse_python
from posttrain.envs.task import Task
from posttrain.rewards.hack_guard import guard
from posttrain.rewards.rubric import RewardComponent, Rubric
from posttrain.rewards.text import completion_text

DATA = Path(__file__).parent / "data" / "code_problems.json"
SYSTEM = "You are a careful Python programmer."
USER = (
    "Write a Python function `{signature}` that {description}\n"
    "Example: {example}\n"
    "Reply with only the function in a ```python code block."
)
# Numeric codes so the level fits a float reward-component column (higher is stronger isolation).
ISOLATION_CODES = {"unsafe": 0.0, "unshare": 1.0, "bwrap": 2.0}
_LANG = re.compile(r"[ \t]*([A-Za-z0-9_+-]*)")
_CLOSE = re.compile(r"[ \t]*```")
MAX_COMPLETION_CHARS = 200_000  # what the code is looked for in; a completion is max_tokens long, far less


@functools.lru_cache(maxsize=1)
def load_problems() -> tuple[dict[str, Any], ...]:
    """Every problem in the data file (cached; callers must not mutate)."""
    return tuple(json.loads(DATA.read_text())["problems"])


def split_problems(
    problems: Sequence[dict[str, Any]], eval_fraction: float = 0.2, split_seed: int = 0
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train, held-out) by problem id. Order by a hash, not by position, so the split does not depend on the
    file's order and a new problem lands on one side without moving others."""

    def key(p: dict[str, Any]) -> str:
        return hashlib.sha256(f"{split_seed}:{p['id']}".encode()).hexdigest()

    ranked = sorted(problems, key=key)
    n_eval = round(len(ranked) * eval_fraction)
    held = {p["id"] for p in ranked[:n_eval]}
    return [p for p in problems if p["id"] not in held], [p for p in problems if p["id"] in held]


def call_repr(entry_point: str, case: dict[str, Any]) -> str:
    args = [repr(a) for a in case.get("args", [])] + [f"{k}={v!r}" for k, v in case.get("kwargs", {}).items()]
    return f"{entry_point}({', '.join(args)})"


def make_prompt(problem: dict[str, Any]) -> list[dict[str, str]]:
    ex = problem["example"]
    example = f"`{call_repr(problem['entry_point'], ex)}` returns `{ex['expected']!r}`."
    user = USER.format(signature=problem["signature"], description=problem["description"], example=example)
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


def make_row(problem: dict[str, Any]) -> dict[str, Any]:
    """A task row. The hidden cases travel as a column (reward functions read it), never in the prompt."""
    return {
        "prompt": make_prompt(problem),
        "problem_id": problem["id"],
        "entry_point": problem["entry_point"],
        "tests": problem["tests"],
    }


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(info language, body) of each ``` block, a block left open running to the end of the text. What
    `re.findall(r"```[ \\t]*([A-Za-z0-9_+-]*)[^\\n]*\\n(.*?)(?:\\n[ \\t]*```|\\Z)", text, re.DOTALL)` returns,
    in linear time: that regex backtracks quadratically over a long last line that has no newline."""
    out: list[tuple[str, str]] = []
    at = 0
    while (start := text.find("```", at)) >= 0:
        nl = text.find("\n", start + 3)
        if nl < 0:  # an opening fence needs the end of its line; no later fence has one either
            break
        info = _LANG.match(text, start + 3)
        assert info is not None  # every part of _LANG is optional: it always matches
        lang = info.group(1)
        body_start = p = nl + 1
        close = None
        while (p := text.find("\n", p)) >= 0 and not (close := _CLOSE.match(text, p + 1)):
            p += 1
        if close is None:  # never closed (p < 0): the block runs to the end
            out.append((lang, text[body_start:]))
            break
        out.append((lang, text[body_start:p]))
        at = close.end()
    return out


def _parses(code: str) -> bool:
    try:
        parse_python(code)
    except BoundedError:
        return False
    return True


def extract_code(text: str, entry_point: str | None = None) -> str | None:
    """The Python code in a completion, or None.

    Prefers a fenced block that defines `entry_point`, then any python-tagged block, then any block. A block
    left open at the end still counts: stop strings and max_tokens cut completions before the closing fence.
    With no fence, text starting at the first `def`/`import`/`from` line is taken when it parses."""
    text = clip(text, MAX_COMPLETION_CHARS)
    blocks = [(lang.lower(), body) for lang, body in fenced_blocks(text)]
    if blocks:
        if entry_point:
            for _, body in blocks:
                # [ \t], not \s: `^\s*` re-scans a run of blank lines from each of its lines (quadratic)
                if re.search(rf"^[ \t]*def[ \t]+{re.escape(entry_point)}[ \t]*\(", body, re.MULTILINE):
                    return body.strip("\n")
        for lang, body in blocks:
            if lang in ("python", "py", "python3"):
                return body.strip("\n")
        return blocks[0][1].strip("\n")
    m = re.search(r"^(def|import|from|class)\s", text, re.MULTILINE)
    if m is None:
        return None
    code = text[m.start() :].strip("\n")
    return code if _parses(code) else None


def all_code(text: str) -> str | None:
    """Every fenced block of a completion joined, else what `extract_code` finds. The hack detector reads
    this: grading picks one block, and a hack hidden in any block must not slip past because another one
    was checked instead."""
    blocks = [body for _, body in fenced_blocks(clip(text, MAX_COMPLETION_CHARS))]
    return "\n\n".join(blocks) if blocks else extract_code(text)


def defines(code: str | None, name: str) -> bool:
    """True when `code` parses and defines a top-level function `name`."""
    if not code:
        return False
    try:
        tree = parse_python(code)
    except BoundedError:
        return False
    return any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name for n in tree.body)


class FunctionGrader:
    """Grades many (code, entry point, cases) jobs at once through a SandboxPool; remembers isolation levels."""

    def __init__(self, sandbox: Any = None, **sandbox_options: Any) -> None:
        from posttrain.sandbox import SandboxConfig, SandboxPool

        self.cfg = sandbox if sandbox is not None else SandboxConfig(**{"timeout_s": 5.0, **sandbox_options})
        self.pool = SandboxPool(self.cfg)
        self.isolation: dict[tuple[str, str], str] = {}

    def grade(self, jobs: list[tuple[str | None, str, list[dict[str, Any]]]]) -> list[Any]:
        """One GradeResult (None where there was no code) per job, `cfg.concurrency` sandboxes at a time."""
        todo = [(i, (code, entry, cases)) for i, (code, entry, cases) in enumerate(jobs) if code]
        results = run_sync(lambda: self.pool.grade_many([job for _, job in todo]))
        out: list[Any] = [None] * len(jobs)
        if len(self.isolation) > 4096:  # a bounded memo: only the latest batch is read back
            self.isolation.clear()
        for (i, (code, entry, _)), r in zip(todo, results):
            out[i] = r
            self.isolation[(code or "", entry)] = r.isolation
        return out


def code_rubric(
    grader: FunctionGrader, format_weight: float = 0.1, detect_hacks: bool = True, partial_credit: bool = True
) -> Rubric:
    """The code-tests rubric over rows with `entry_point` and `tests` columns. partial_credit=False scores
    tests_passed 1 only when every case passes (else 0): partial credit pays a one-line guess that gets some
    cases right, which a small model drifts towards (see docs/code_tasks.md)."""

    def tests_passed(
        completions: list[Any], entry_point: list[str], tests: list[list[dict[str, Any]]], **kwargs: Any
    ) -> list[float]:
        codes = [extract_code(completion_text(c), e) for c, e in zip(completions, entry_point)]
        results = grader.grade(list(zip(codes, entry_point, tests)))
        scores = [r.score if r is not None else 0.0 for r in results]
        return scores if partial_credit else [float(x >= 1.0) for x in scores]

    def code_format(completions: list[Any], entry_point: list[str], **kwargs: Any) -> list[float]:
        return [float(defines(extract_code(completion_text(c), e), e)) for c, e in zip(completions, entry_point)]

    def sandbox_isolation(completions: list[Any], entry_point: list[str], **kwargs: Any) -> list[float]:
        out = []
        for c, e in zip(completions, entry_point):
            level = grader.isolation.get((extract_code(completion_text(c), e) or "", e))
            out.append(ISOLATION_CODES.get(level, -1.0) if level else -1.0)  # -1: not graded (no code)
        return out

    rubric = Rubric(
        [
            RewardComponent("tests_passed", tests_passed, weight=1.0, pass_threshold=1.0),
            RewardComponent("code_format", code_format, weight=format_weight, pass_threshold=1.0),
            RewardComponent("sandbox_isolation", sandbox_isolation, weight=0.0, pass_threshold=0.0),
        ],
        pass_component="tests_passed",
    )
    return guard(rubric, code_of=all_code) if detect_hacks else rubric


def reference_completion(problem: dict[str, Any]) -> str:
    return f"```python\n{problem['solution'].rstrip()}\n```"


def wrong_completion(problem: dict[str, Any]) -> str:
    """A deliberately wrong answer: the right name and signature, returning None."""
    return f"```python\ndef {problem['signature']}:\n    return None\n```"


def make_task(
    seed: int = 0,
    eval_fraction: float = 0.2,
    split_seed: int = 0,
    difficulties: list[str] | None = None,
    detect_hacks: bool = True,
    format_weight: float = 0.1,
    sandbox: dict[str, Any] | None = None,
    max_tokens: int = 256,
    problems: Sequence[dict[str, Any]] | None = None,
    partial_credit: bool = True,
) -> Task:
    """The `code-tests` task. `difficulties` keeps only those levels ("easy", "medium", "hard");
    `sandbox` holds SandboxConfig fields (e.g. {"backend": "unsafe", "allow_unsafe": true} where no
    isolation tool exists); `problems` replaces the built-in set (same JSON shape). `seed` is unused: the
    split depends only on `split_seed`, so runs with different seeds share one held-out set."""
    del seed
    probs = list(problems if problems is not None else load_problems())
    if difficulties:
        probs = [p for p in probs if p.get("difficulty", "easy") in difficulties]
    train, held = split_problems(probs, eval_fraction, split_seed)
    grader = FunctionGrader(**(sandbox or {}))
    task = Task(
        name="code-tests",
        train_rows=[make_row(p) for p in train],
        eval_rows=[make_row(p) for p in held],
        rubric=code_rubric(grader, format_weight, detect_hacks, partial_credit),
        description=f"Write a small Python function that passes hidden tests ({len(train)} train / "
        f"{len(held)} held-out problems); reward = "
        + ("fraction of hidden cases passed." if partial_credit else "1 if every hidden case passes."),
        max_tokens=max_tokens,
        # Stop after the closing fence: a fence followed by a newline ends the code; the opening fence
        # ("```python\n") does not match, so prose before the code is allowed.
        stop=["\n```\n"],
    )
    # Smoke checks for `posttrain env check` (envs/smoke_checks.py): a reference passes, a wrong answer and a hack
    # do not. One problem per split keeps the check to a few sandbox runs.
    by_id = {p["id"]: p for p in probs}
    from posttrain.envs.smoke_checks import SmokeCheck

    checks = []
    for split, rows in (("train", task.train_rows), ("eval", task.eval_rows)):
        if rows:
            row, p = rows[0], by_id[rows[0]["problem_id"]]
            checks.append(
                SmokeCheck(f"reference {split}:{p['id']}", row=row, completion=reference_completion(p), expect="pass")
            )
            checks.append(
                SmokeCheck(f"wrong {split}:{p['id']}", row=row, completion=wrong_completion(p), expect="fail")
            )
    row, p = task.train_rows[0], by_id[task.train_rows[0]["problem_id"]]
    if detect_hacks:
        hack = f"```python\nimport sys\ndef {p['signature']}:\n    sys.exit(0)\n```"
        checks.append(SmokeCheck(f"hack is zeroed:{p['id']}", row=row, completion=hack, expect="fail"))
    task.smoke_checks = checks
    task.problems = {p["id"]: p for p in probs}  # pyright: ignore[reportAttributeAccessIssue]  # not a Task field
    return task
