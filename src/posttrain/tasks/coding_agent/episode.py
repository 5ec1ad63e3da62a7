"""One coding-agent episode: the tools bound to the episode's own RepoCopy, and the grade when it ends.

ToolEnv makes a RepoEpisode per rollout (Task.episode), so the G rollouts of an issue, and every other episode
running at once, each edit their own copy. `run_tests` and the end of the episode send the copy's sources (never
its tests) to the task's grader, which runs them against the pristine test files in the sandbox (grade_pytest:
hash-checked tests, out of process where the machine allows it). The episode's copy of the tests is there to be
read; edit_file refuses to change it, and nothing the copy holds reaches a grade.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

from posttrain.envs.tool_env import EpisodeEnd
from posttrain.envs.tools import ToolError
from posttrain.tasks.coding_agent.repo import RepoCopy, cap, hack_flags

Grade = Callable[[dict[str, str]], Awaitable[Any]]  # sources -> GradeResult, against the pristine tests
TOOL_NAMES = ["list_files", "read_file", "search", "edit_file", "run_tests", "submit"]


class RepoEpisode:
    """The agent's tools over one private copy of a repository. `grade` None: a template that only lends its
    tools' schemas to the prompt (every tool sees an empty repository, and run_tests refuses)."""

    def __init__(
        self,
        sources: dict[str, str],
        tests: dict[str, str],
        grade: Grade | None,
        require_submit: bool = True,
        detect_hacks: bool = True,
        grade_start: Callable[[], Awaitable[Any]] | None = None,
    ):
        self.repo = RepoCopy(sources, tests)
        self.start = dict(self.repo.sources)
        self._grade = grade
        self._grade_start = grade_start  # the untouched code's Baseline (per issue): which tests the issue breaks
        self.require_submit, self.detect_hacks = require_submit, detect_hacks
        self.tests_run = self.edits = 0
        self.tested_after_edit = False
        self.submitted = False

    @property
    def tools(self) -> list[Callable[..., Any]]:
        return [getattr(self, name) for name in TOOL_NAMES]

    # ---- tools (their docstrings and type hints are the schemas the model sees) --------------------------------

    def list_files(self) -> str:
        """List the repository's files with their line counts; test files are read-only."""
        return self.repo.listing()

    def read_file(self, path: str, start_line: int = 0, end_line: int = 0) -> str:
        """Show a file with line numbers (the numbers are not part of the file).

        Args:
            path: the file, as list_files shows it
            start_line: first line to show (default 1)
            end_line: last line to show (default: the last line)
        """
        return self.repo.read(path, start_line, end_line)

    def search(self, pattern: str, regex: bool = False) -> str:
        """Find the lines of every file that contain pattern; one 'path:line: text' per match.

        Args:
            pattern: the text to look for
            regex: true to treat pattern as a regular expression
        """
        return self.repo.search(pattern, regex)

    def edit_file(self, path: str, new: str, old: str = "", start_line: int = 0, end_line: int = 0) -> str:
        """Edit a source file: replace the exact text old (it must occur exactly once) with new, or replace the
        lines start_line to end_line with new. Test files cannot be edited.

        Args:
            path: the file, as list_files shows it
            new: the replacement text
            old: the exact text to replace, indentation included, without line numbers
            start_line: first line to replace (instead of old)
            end_line: last line to replace (default start_line)
        """
        out = self.repo.edit(path, new, old, start_line, end_line)
        self.edits += 1
        self.tested_after_edit = False
        return out

    async def run_tests(self) -> str:
        """Run the repository's tests on the current code; says how many pass and shows the first failure."""
        if self._grade is None:
            raise ToolError("this tool is not bound to an episode")
        g = await self._grade(dict(self.repo.sources))
        self.tests_run += 1
        self.tested_after_edit = True
        return summarize(g)

    def submit(self, summary: str = "") -> str:
        """Submit the code as it is now and end the episode; the repository's tests grade it.

        Args:
            summary: one line on what you changed
        """
        self.submitted = True  # ToolEnv ends the episode on this call without running it; finish() sees it
        return "submitted"

    # ---- end of the episode ------------------------------------------------------------------------------------

    async def finish(self, final_call: dict[str, Any] | None) -> EpisodeEnd:
        """Grade the final state (when submitted, or always with require_submit off) against the pristine tests.
        Columns for the rubric: final_grade (None: not graded), final_files, submitted."""
        self.submitted = self.submitted or (final_call is not None and final_call.get("name") == "submit")
        grade = None
        if self._grade is not None and (self.submitted or not self.require_submit):
            g = await self._grade(dict(self.repo.sources))
            grade = {
                "score": float(g.score),
                "passed": int(g.passed),
                "total": int(g.total),
                "trust": g.trust,
                "error": g.error,
                "per_test": getattr(g, "per_test", None),
                "start_per_test": None,
                "start_error": "no baseline grader",
            }
            if self._grade_start is not None:  # a Baseline: per_test None (unknown) with the reason in error
                start = await self._grade_start()
                grade["start_per_test"], grade["start_error"] = start.per_test, start.error
        flags = hack_flags(self.start, self.repo.sources) if self.detect_hacks else []
        all_pass = grade is not None and grade["total"] > 0 and grade["passed"] == grade["total"]
        metrics = {
            "resolved": float(all_pass and not flags),
            "submitted": float(self.submitted),
            "tests_run_before_submit": float(self.tests_run),
            "edits": float(self.edits),
            # the state that ended the episode was the one last tested
            "verified": float(self.tests_run > 0 and self.tested_after_edit),
        }
        return EpisodeEnd(
            metrics=metrics,
            columns={"final_grade": grade, "final_files": dict(self.repo.sources), "submitted": self.submitted},
        )


_TEST_DIR = re.compile(r"(?:\.\./)*/?tests/(?=tests/)")


def first_failure(stdout: str) -> str:
    """The first failing test from pytest's short summary and the first error line of the tracebacks, which is
    that test's ('tests/x.py::test_t - assert 3 == 4'; the summary's own message is cut at the terminal width).
    For a test module that failed to import, the import error. Only shown to the model: the counts come from the
    grader's checked channel, never from this text."""
    lines = stdout.splitlines()
    err = next((x[1:].strip() for x in lines if x.startswith("E ") and x[1:].strip()), "")
    for line in lines:
        if line.startswith(("FAILED ", "ERROR ")):
            # the solution's own prints reach stdout too: cut the line before the regex, whose `(?:\.\./)*` re-scans
            # a long run of '../' from each of its positions (only 400 characters are shown anyway)
            where = _TEST_DIR.sub("", line.split(" ", 1)[1][:1000]).split(" - ")[0]
            if line.startswith("ERROR "):
                where += " could not be collected"
            return f"{where} - {err}"[:400] if err else where[:400]
    return err[:400]


def summarize(g: Any) -> str:
    """What run_tests returns: the counts, then the first failure."""
    if g.total and g.passed == g.total:
        return f"all {g.total} tests pass"
    head = f"{g.passed} passed, {g.total - g.passed} failed (of {g.total} tests)"
    if g.timed_out:
        return head + "; the run timed out"
    detail = first_failure(g.run.stdout if getattr(g, "run", None) is not None else "") or (g.error or "")
    return cap(head + (f"\nfirst failure: {detail}" if detail else ""), 800)
