"""An episode's own copy of a repository and the pure operations the agent's tools perform on it.

The copy is a dict `path -> text`. Listing, reading, searching and editing look paths up in that dict and never
open anything on the host: an absolute path, a `..`, or a name the dict lacks is an error the model reads, not a
read of the machine. Tests are a separate dict the agent can read but never edit; what grades the agent is the
task's pristine copy of them, not this one (episode.py).

Every operation bounds its output (MAX_OUTPUT characters). A regex search is compiled and matched in a worker
process with a memory cap, killed past its time budget (posttrain.bounded), and the syntax check after an edit
parses with size and depth caps, so no argument a policy writes can stall a worker, grow the trainer's memory or
flood the context.
"""

from __future__ import annotations

import posixpath

from posttrain.bounded import BoundedError, BoundedTimeout, parse_python
from posttrain.bounded_regex import search_lines
from posttrain.envs.tools import ToolError
from posttrain.rewards.hack_detector import HackFlag, detect_code, detect_files

MAX_OUTPUT = 3000  # characters of any one tool result
MAX_MATCHES = 30  # search results shown
MAX_PATTERN = 200  # characters of a search pattern
MAX_LINE = 500  # characters of a line that search looks at
REGEX_BUDGET_S = 0.5  # wall clock for one regex search over the whole repo
MAX_NEW = 8000  # characters an edit may insert at once
MAX_FILE = 32000  # characters a file may grow to


def is_test_path(rel: str) -> bool:
    """Test files, read-only to the agent: anything under tests/, conftest.py, pytest.ini, test_*.py."""
    parts = rel.split("/")
    return parts[0] == "tests" or parts[-1] in ("conftest.py", "pytest.ini") or parts[-1].startswith("test_")


def clean_path(path: object) -> str:
    """A repo-relative path in the form list_files prints. Refuses what could name a host file (absolute paths,
    drive letters, `~`, `..`) with a message that says how paths look here."""
    if not isinstance(path, str) or not path.strip():
        raise ToolError("path must be a non-empty string, a file as list_files shows it (e.g. 'pkg/module.py')")
    p = path.strip().replace("\\", "/")
    if "\0" in p or len(p) > 300:
        raise ToolError("not a valid path")
    if p.startswith(("/", "~")) or (len(p) > 1 and p[1] == ":"):
        raise ToolError(f"{p!r} is absolute; paths are relative to the repository root, as list_files shows them")
    parts = [x for x in p.split("/") if x not in ("", ".")]
    if ".." in parts:
        raise ToolError(f"{p!r} leaves the repository ('..' is not allowed)")
    return posixpath.join(*parts) if parts else ""


def as_int(value: object, name: str) -> int:
    """An integer argument; a string of digits is accepted (models often quote numbers), nothing else."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ToolError(f"{name} must be an integer, got {type(value).__name__}")
    if isinstance(value, str):
        if not value.strip().isdigit():
            raise ToolError(f"{name} must be an integer, got {value[:20]!r}")
        value = int(value.strip())
    if not 0 <= value <= 10**6:
        raise ToolError(f"{name} must be between 0 and 1000000, got {value}")
    return value


def cap(text: str, limit: int = MAX_OUTPUT) -> str:
    return text if len(text) <= limit else text[: limit - 40] + f"\n[... {len(text) - limit + 40} more characters]"


def numbered(lines: list[str], first: int) -> str:
    """Lines with their 1-based numbers, the way read_file shows them (numbers are not part of the text)."""
    return "\n".join(f"{first + i:>4}| {line}" for i, line in enumerate(lines))


def occurrences(text: str, old: str, limit: int = 100) -> list[int]:
    """Start offsets of `old` in `text`, overlapping ones included (for 'exactly one match')."""
    out, i = [], text.find(old)
    while i != -1 and len(out) < limit:
        out.append(i)
        i = text.find(old, i + 1)
    return out


class RepoCopy:
    """One episode's files. `sources` are editable, `tests` read-only; both are private copies."""

    def __init__(self, sources: dict[str, str], tests: dict[str, str]):
        self.sources = {clean_path(p): str(t) for p, t in sources.items()}
        self.tests = {clean_path(p): str(t) for p, t in tests.items()}
        if any(is_test_path(p) for p in self.sources):
            raise ValueError("test files belong in `tests`, not in the editable sources")

    def text(self, path: object) -> tuple[str, str]:
        p = clean_path(path)
        if p in self.sources:
            return p, self.sources[p]
        if p in self.tests:
            return p, self.tests[p]
        raise ToolError(f"no file {p!r} in the repository; list_files shows the files")

    def listing(self) -> str:
        lines = [f"{p} ({len(t.splitlines())} lines)" for p, t in sorted(self.sources.items())]
        lines += [f"{p} ({len(t.splitlines())} lines, read-only)" for p, t in sorted(self.tests.items())]
        return cap("\n".join(lines))

    def read(self, path: object, start_line: object = 0, end_line: object = 0) -> str:
        p, text = self.text(path)
        lines = text.splitlines()
        start, end = as_int(start_line, "start_line") or 1, as_int(end_line, "end_line") or len(lines)
        if lines and not 1 <= start <= len(lines):
            raise ToolError(f"start_line {start} is outside {p} (lines 1-{len(lines)})")
        end = min(end, len(lines))
        if end < start and lines:
            raise ToolError(f"end_line {end} is before start_line {start}")
        out, shown = [], start - 1
        budget = MAX_OUTPUT - 120
        for i in range(start - 1, end):  # whole lines only, so a cut file can be read on from a line number
            line = f"{i + 1:>4}| {lines[i][:400]}"
            if budget - len(line) - 1 < 0:
                break
            out.append(line)
            budget -= len(line) + 1
            shown = i + 1
        body = "\n".join(out) if lines else "(empty file)"
        if shown < end:
            body += f"\n[... lines {shown + 1}-{end} not shown: read_file with start_line={shown + 1}]"
        return body

    def search(self, pattern: object, use_regex: object = False) -> str:
        if not isinstance(pattern, str) or not pattern:
            raise ToolError("pattern must be a non-empty string")
        if len(pattern) > MAX_PATTERN:
            raise ToolError(f"pattern is {len(pattern)} characters long; at most {MAX_PATTERN}")
        if not isinstance(use_regex, bool):
            raise ToolError(f"regex must be true or false, got {type(use_regex).__name__}")
        where = [
            (path, n, line[:MAX_LINE])  # the cut bounds the work of one match as well as the output
            for path, text in sorted({**self.sources, **self.tests}.items())
            for n, line in enumerate(text.splitlines(), 1)
        ]
        if use_regex:
            found, total = self._regex_hits(pattern, [line for _, _, line in where])
        else:
            found = [i for i, (_, _, line) in enumerate(where) if pattern in line]
            total = len(found)
        hits = [f"{where[i][0]}:{where[i][1]}: {where[i][2].strip()[:160]}" for i in found[:MAX_MATCHES]]
        if not hits:
            return f"no matches for {pattern!r}"
        more = f"\n[... {total - len(hits)} more matches]" if total > len(hits) else ""
        return cap("\n".join(hits) + more)

    @staticmethod
    def _regex_hits(pattern: str, lines: list[str]) -> tuple[list[int], int]:
        """(indices of the first matching lines, how many match). The model's pattern is compiled and matched in
        posttrain.bounded's worker process, never here: a counted-repeat pattern of 40 characters compiled to
        gigabytes in the trainer (and the regex module cached it)."""
        try:
            hits = search_lines(pattern, lines, REGEX_BUDGET_S, max_hits=MAX_MATCHES)
        except BoundedTimeout:
            raise ToolError(
                f"the regex search took longer than {REGEX_BUDGET_S}s; use a simpler pattern or a plain-text search"
            ) from None
        except BoundedError as e:
            reason = e.reason if e.reason.startswith("bad regular expression") else f"bad regular expression: {e}"
            raise ToolError(reason[:160]) from None
        return hits.lines, hits.total

    def edit(self, path: object, new: object, old: object = "", start_line: object = 0, end_line: object = 0) -> str:
        p = clean_path(path)
        if p in self.tests or is_test_path(p):
            raise ToolError(f"{p} is a test file: tests are read-only (run_tests always runs the original tests)")
        if p not in self.sources:
            raise ToolError(
                f"no file {p!r} in the repository; list_files shows the files (edit_file cannot create files)"
            )
        if not isinstance(new, str) or not isinstance(old, str):
            raise ToolError("new and old must be strings")
        if len(new) > MAX_NEW:
            raise ToolError(f"new is {len(new)} characters long; edit at most {MAX_NEW} at once")
        start, end = as_int(start_line, "start_line"), as_int(end_line, "end_line")
        text = self.sources[p]
        if old and (start or end):
            raise ToolError(
                "give either old (replace that exact text) or start_line/end_line (replace those lines), not both"
            )
        if old:
            at = occurrences(text, old)
            if not at:
                raise ToolError(
                    f"old text not found in {p}: it must match the file exactly, indentation "
                    "included (copy it from read_file without the line numbers)"
                )
            if len(at) > 1:
                raise ToolError(
                    f"old text matches {len(at)} places in {p}; include more of the surrounding "
                    "lines so it matches exactly one"
                )
            result = text[: at[0]] + new + text[at[0] + len(old) :]
            first = text.count("\n", 0, at[0]) + 1
        elif start:
            lines = text.splitlines(keepends=True)
            end = end or start
            if not 1 <= start <= end <= len(lines):
                raise ToolError(f"lines {start}-{end} are outside {p} (lines 1-{len(lines)})")
            if lines and not lines[-1].endswith("\n"):
                lines[-1] += "\n"
            result = (
                "".join(lines[: start - 1])
                + (new if not new or new.endswith("\n") else new + "\n")
                + "".join(lines[end:])
            )
            first = start
        else:
            raise ToolError("give old (the exact text to replace) or start_line and end_line (the lines to replace)")
        if len(result) > MAX_FILE:
            raise ToolError(f"{p} would be {len(result)} characters long; at most {MAX_FILE}")
        self.sources[p] = result
        last = first + max(new.count("\n") - (1 if new.endswith("\n") else 0), 0)
        lines = result.splitlines()
        lo, hi = max(first - 2, 1), min(last + 2, len(lines))
        out = f"edited {p}; lines {lo}-{hi} now read:\n" + numbered([x[:400] for x in lines[lo - 1 : hi]], lo)
        warning = ""
        if p.endswith(".py"):
            try:
                parse_python(result, max_chars=2 * MAX_FILE)
            except BoundedError as e:  # syntax, or nested too deeply to parse safely here
                warning = f"\nwarning: {p} no longer parses ({e.reason[:200]})"
        return cap(out, MAX_OUTPUT - len(warning)) + warning  # a long echo must not cut the warning off


def hack_flags(start: dict[str, str], final: dict[str, str]) -> list[HackFlag]:
    """Reward-hack flags the agent's edits introduced: flags in changed files that the starting file did not have
    (the repos' own code is not the agent's), and hook or test files among paths it added."""
    flags = detect_files([p for p in final if p not in start])
    for path, text in final.items():
        if path.endswith(".py") and text != start.get(path):
            before = {(f.kind, f.detail) for f in detect_code(start.get(path, ""))}
            flags += [f for f in detect_code(text) if (f.kind, f.detail) not in before]
    return flags
