"""Which paths are the tests': what the hack detector (rewards/hack_detector.py) asks of every path a solution
opens, lists, imports or runs, its parts not known statically (hack_strings.UNKNOWN) matching like a glob's '*'.
"""

from __future__ import annotations

import posixpath
import re

from posttrain.rewards.hack_strings import UNKNOWN

# A path a solution writes or reads that is a test file, a test directory or a conftest.
TEST_PATH = re.compile(r"(^|[/\\])(tests?[/\\]|test_[\w.-]*\.py$|[\w-]*_test\.py$|conftest)")
# A string anywhere that names a test path, the process table, or pytest's variable with the current test's id.
TEST_REF = re.compile(r"[/\\]tests?\Z|(?:^|[/\\])test_[\w.-]{0,100}\.py\b|/proc/|PYTEST_CURRENT_TEST")
# One path component that is a test file or directory (only where a string is used as a path).
TEST_COMPONENT = re.compile(r"tests?|conftest(?:\.py)?|pytest\.ini|test_.*|.*_tests?(?:\.py)?", re.IGNORECASE)
# A path pattern built with unknown parts ('*') that matches where tests live but no ordinary source path.
TEST_PROBES = ("/tests/test_solution.py", "tests/test_solution.py", "test_solution.py", "/tests", "tests")
OTHER_PROBES = ("/src/lib_module.py", "src/lib_module.py", "lib_module.py", "/src", "src")


def glob_match(pattern: str, text: str) -> bool:
    """fnmatch semantics ('*' any run, '?' and a '[...]' set any one character: conservative), without a regex
    or fnmatch's cache of compiled patterns: a table over pattern x text, both short here."""
    pattern = re.sub(r"\[[^\]]{0,50}\]", "?", pattern[:300])
    row = [True] + [False] * len(text)
    for c in pattern:
        if c == "*":
            nxt = [False] * (len(text) + 1)
            nxt[0] = row[0]
            for j in range(1, len(text) + 1):
                nxt[j] = nxt[j - 1] or row[j]
        else:
            nxt = [False] + [row[j] and (c == "?" or c == text[j]) for j in range(len(text))]
        row = nxt
        if not any(row):
            return False
    return row[-1]


def path_reason(path: str, listing: bool = False) -> str | None:
    """Why a string used as a path reads the tests (None: it does not). Parts not known statically are UNKNOWN,
    which matches like a glob's '*'. `listing`: the path is a directory or glob pattern being listed, where the
    working directory, `/` and the parent are where test files are found."""
    raw = path[:1000].replace("\\", "/")
    p = raw.replace(UNKNOWN, "*")
    if TEST_REF.search(p) or TEST_PATH.search(p):
        return "test path"
    wild = any(c in p for c in "*?[")
    if wild and any(glob_match(p, t) for t in TEST_PROBES) and not any(glob_match(p, o) for o in OTHER_PROBES):
        return "pattern that matches the tests"
    parts = [c for c in p.split("/") if c]
    if any(len(c) < 256 and not any(w in c for w in "*?[") and TEST_COMPONENT.fullmatch(c) for c in parts):
        return "test path"
    if listing:
        known = []
        for c in raw.split("/"):
            if UNKNOWN in c:  # a computed directory: not known to be where the tests are
                return None
            if any(w in c for w in "*?["):
                break
            known.append(c)
        d = posixpath.normpath("/".join(known) or ".") if known != [""] else "/"
        if d in (".", "/", "..") or d.startswith("../"):
            return f"lists {d} (where the tests are)"
    return None
