"""The hidden-data rule: nothing a grader knows is readable by the code it grades.

Tests, expected values and reference solutions stay with the grading process: the pristine tests are readable
by the test process's uid alone (sandbox/run.py hide_tree), expected values never enter the sandbox
(grade_function), and the box's own dirs belong to root so the graded code cannot swap them. Each built-in
task that grades with hidden data is tried from inside: code that reads what the grader knows must fail to.
"""

from __future__ import annotations

import asyncio

import pytest
from sbhelpers import MARK, needs_root

from posttrain.sandbox import grade_function, grade_pytest

pytestmark = needs_root

# Module-level code of a solution that looks for `needle` in every file and process record it can read and
# prints what it found (two-process grading shows the solution's stdout in run.stdout), then reports whether
# /tests can be listed or read.
SCANNER = r'''
import os
def _scan(needle):
    found = []
    roots = ["/tests", "/in", "/sandbox", "/tmp", "/etc"]
    for root in roots:
        for d, dirs, files in os.walk(root):
            for n in files:
                p = os.path.join(d, n)
                try:
                    with open(p, "rb") as f:
                        if needle.encode() in f.read(1 << 20):
                            found.append(p)
                except OSError:
                    pass
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            for part in ("cmdline", "environ", "maps"):
                try:
                    with open(f"/proc/{pid}/{part}", "rb") as f:
                        if needle.encode() in f.read():
                            found.append(f"/proc/{pid}/{part}")
                except OSError:
                    pass
    return found
def _tests_access():
    try:
        names = os.listdir("/tests")
    except OSError as e:
        return f"list-denied:{type(e).__name__}"
    for n in names:
        try:
            open(os.path.join("/tests", n)).read()
            return "read-ok"
        except OSError:
            pass
    return "list-ok"
print("FOUND:", _scan(NEEDLE), flush=True)
print("TESTS:", _tests_access(), flush=True)
'''


def _solution(needle: str, body: str) -> str:
    # spelled in hex, so the solution's own file does not hold the needle it looks for
    return f"NEEDLE = bytes.fromhex({needle.encode().hex()!r}).decode()\n" + SCANNER + body


@pytest.fixture
def cfg(cfg):
    """The sandbox conftest's config with room for the scanner: at import the solution reads every file under /etc
    and every /proc record it may, which under a loaded CI (vLLM servers starting on the other worker) took more
    than the 10 s per request the conftest allows, and the grade then failed for time, not for what it found."""
    return cfg.model_copy(update={"case_timeout_s": 60.0, "timeout_s": 120.0})


def test_pristine_tests_unreadable_by_the_graded_code(cfg):
    """The asserted value sits only in the test file; the solution scans everything it can read for it."""
    needle = f"answer-{MARK}"
    tests = {"test_hidden.py": f"from sol import answer\n\n\ndef test_answer():\n    assert answer() == {needle!r}\n"}
    sol = _solution(needle, "def answer():\n    return 'no idea'\n")
    g = grade_pytest({"sol.py": sol}, tests, cfg)
    assert g.trust == "out-of-process" and g.score == 0.0
    assert "FOUND: []" in g.run.stdout, g.run.stdout[-2000:]
    assert "TESTS: list-denied" in g.run.stdout, g.run.stdout[-2000:]


def test_the_scanner_finds_what_is_readable(cfg):
    """Control: the same scanner finds a needle in the solution's own files, so an empty result above means
    the tests were out of reach, not that the scanner is blind."""
    needle = f"visible-{MARK}"
    tests = {"test_v.py": "from sol import answer\n\n\ndef test_v():\n    assert answer() == 1\n"}
    g = grade_pytest({"sol.py": _solution(needle, "def answer():\n    return 1\n"),
                      "notes.txt": needle}, tests, cfg)
    assert g.score == 1.0
    assert "/sandbox/work/notes.txt" in g.run.stdout and "/in/files/notes.txt" in g.run.stdout, g.run.stdout[-2000:]


def test_grade_function_expected_values_never_enter(cfg):
    """code-tests grades with grade_function: only the args go in, so a solution that searches for the
    expected value finds nothing, while the args (control) are found."""
    expected, arg = f"expected-{MARK}", f"argument-{MARK}"
    code = _solution(expected, "def f(x):\n    return _scan(NEEDLE) or 'none'\n") + \
        "def g(x):\n    return 'seen' if _scan(x) else 'unseen'\n"
    hidden = grade_function(code, "f", [{"args": [arg], "expected": expected}], cfg)
    assert hidden.score == 0.0
    seen = grade_function(code, "g", [{"args": [arg], "expected": "seen"}], cfg)
    assert seen.score == 1.0


def test_box_is_roots_and_sticky_so_the_solution_cannot_swap_root_dirs(cfg):
    """/sandbox holds the test process's private home and the root-only FIFO dir: the solution's uid must not
    be able to rename them and put its own in their place."""
    probe = r'''
import os, stat
st = os.stat("/sandbox")
print("BOX:", st.st_uid, oct(stat.S_IMODE(st.st_mode)), flush=True)
for name in ("runner", "rpc"):
    try:
        os.rename(f"/sandbox/{name}", f"/sandbox/{name}-moved")
        print(f"RENAME {name}: ok", flush=True)
    except OSError as e:
        print(f"RENAME {name}: {type(e).__name__}", flush=True)
def one():
    return 1
'''
    tests = {"test_one.py": "from sol import one\n\n\ndef test_one():\n    assert one() == 1\n"}
    g = grade_pytest({"sol.py": probe}, tests, cfg)
    assert g.score == 1.0, g.error
    assert "BOX: 0 0o1777" in g.run.stdout, g.run.stdout[-2000:]
    assert "RENAME runner: PermissionError" in g.run.stdout and "RENAME rpc: PermissionError" in g.run.stdout


# ---- the built-in tasks that grade with hidden data, tried through their own graders ----------------------------

# Prepended to a correct answer: it breaks the answer whenever the pristine tests can be listed or read.
GUARD = ("import os as _os\n"
         "try:\n"
         "    _os.listdir('/tests')\n"
         "    _LEAK = True\n"
         "except OSError:\n"
         "    _LEAK = False\n")


def test_feature_deletion_tests_unreadable():
    from posttrain.tasks import feature_deletion as F

    task = F.make_task(detect_hacks=False)
    row = task.train_rows[0]
    ref = task.references[(row["repo"], row["path"], row["qualname"])]
    name = row["qualname"].rsplit(".", 1)[-1]
    # the restored function raises when it could reach the tests, so it passes only where they are hidden
    lines = ref.splitlines(keepends=True)
    head = next(i for i, line in enumerate(lines) if line.lstrip().startswith(f"def {name}"))
    while not lines[head].rstrip().endswith(":"):
        head += 1
    indent = " " * (len(lines[head + 1]) - len(lines[head + 1].lstrip()))
    guard = "".join(indent + x + "\n" for x in GUARD.splitlines()) + f"{indent}assert not _LEAK, 'read the tests'\n"
    body = "".join(lines[: head + 1]) + guard + "".join(lines[head + 1:])
    cols = {k: v for k, v in row.items() if k != "prompt"}
    scores = task.rubric.score([[{"role": "assistant", "content": f"```python\n{body}```"}]], [cols])
    assert scores[0].components["issue_tests"] == 1.0, scores[0]


def test_coding_agent_tests_unreadable():
    from posttrain.tasks.coding_agent import data
    from posttrain.tasks.coding_agent.task import Grader

    issue = data.issues("bug", data.repo_names("bug")[0])[0]
    files = dict(issue.sources)
    for e in issue.fix:
        files[e["path"]] = files[e["path"]].replace(e["old"], e["new"], 1)
    target = next(p for p in sorted(files) if p.endswith(".py") and not p.endswith("__init__.py"))
    files[target] = GUARD + "assert not _LEAK, 'read the tests'\n" + files[target]
    grader = Grader()
    fixed = asyncio.run(grader(issue.kind, issue.repo, files))
    assert fixed.trust == "out-of-process" and fixed.score == 1.0, (fixed.error, fixed.run.stdout[-500:])
