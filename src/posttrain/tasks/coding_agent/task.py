"""`coding-agent`: fix an issue in a small Python repository over many turns of tool calls.

The agent gets an issue and the repository's file list (not its contents) and works with six tools, each on the
episode's own copy of the repo (episode.py): list_files, read_file, search, edit_file (string replace or a line
range), run_tests (the pristine tests, graded in the sandbox) and submit, which ends the episode. Issues are the
feature-deletion repos' deleted functions and the bugs seeded in the repos written for this task (data.py);
train and held-out rows are split BY REPOSITORY, so a held-out repo's code is never seen in training.

Reward: the final state, graded at submit against the pristine tests: `issue_tests`, the tests the untouched code
fails that now pass, times those it passed still passing (its baseline graded up front by Task.prepare and kept
only when it came to a verdict: tasks/baselines.py), or `tests_passed` (the pass is all of them); 0 without a
submit; `grading_trust` (weight 0) says how the grade was obtained and `hack_flagged` (weight 0) zeroes samples
whose edits add a reward hack (hack_detector). Episode metrics (`episode/<name>`): resolved, turns, tool_errors,
tests_run_before_submit, edits, verified, submitted. See docs/coding_agent.md.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from posttrain.envs.smoke_checks import SmokeCheck
from posttrain.envs.task import Task
from posttrain.rewards.hack_guard import GuardedRubric
from posttrain.rewards.repair_grades import Baseline, check_repair_reward, issue_rewards
from posttrain.rewards.rubric import RewardComponent
from posttrain.sampling.tool_calls import BLOCK, fenced_block
from posttrain.tasks.baselines import BaselineStore
from posttrain.tasks.coding_agent import data
from posttrain.tasks.coding_agent.episode import RepoEpisode
from posttrain.tasks.coding_agent.repo import hack_flags

DEFAULT_EVAL_REPOS = ("textkit", "gradebook")  # one of each kind, never trained on
INSTRUCTIONS = (
    "Fix the issue in this Python repository. Make one tool call per reply, for example:\n"
    '<tool_call>{{"name": "read_file", "arguments": {{"path": "{example}"}}}}</tool_call>\n'
    "Tools: list_files; read_file (shows line numbers); search; edit_file (replace the exact text old with new, "
    "or the lines start_line to end_line); run_tests (runs the repository's tests; files under tests/ are "
    "read-only); submit (ends the episode: the tests grade your code)."
)


# With demo_edits=blocks (or anchors) the prompt says how code goes outside the JSON (sampling/tool_calls.py, block
# arguments): blocks edits by line number, anchors by the exact text of the lines that change.
BLOCK_INSTRUCTIONS = {
    "blocks": (
        '\nTo write code, put it in a fenced block first and give the argument as "```":\n'
        "```python\n    return x + 1\n```\n"
        '<tool_call>{{"name": "edit_file", "arguments": {{"path": "{example}", "start_line": 7, '
        '"end_line": 7, "new": "```"}}}}</tool_call>'
    ),
    "anchors": (
        '\nTo write code, put it in a fenced block first and give the argument as "```"; old is the exact '
        "text of the lines to replace:\n"
        "```python\n    return x + 1\n```\n"
        '<tool_call>{{"name": "edit_file", "arguments": {{"path": "{example}", "old": "    return x\\n", '
        '"new": "```"}}}}</tool_call>'
    ),
}


def prompt_text(issue: data.Issue, tests: list[str], edits: str = "text") -> str:
    files = "\n".join(sorted(issue.sources)) + "".join(f"\n{t} (read-only)" for t in sorted(tests))
    example = next(p for p in sorted(issue.sources) if not p.endswith("__init__.py"))
    how = INSTRUCTIONS + BLOCK_INSTRUCTIONS.get(edits, "")
    return f"{how.format(example=example)}\n\nIssue: {issue.text}\n\nFiles:\n{files}"


def make_row(issue: data.Issue, edits: str = "text") -> dict[str, Any]:
    tests = sorted(data.pristine_tests(issue.kind, issue.repo))
    return {
        "prompt": [{"role": "user", "content": prompt_text(issue, tests, edits)}],
        "kind": issue.kind,
        "repo": issue.repo,
        "issue_id": f"{issue.repo}:{issue.id}",
        "files": dict(issue.sources),
        "fix": [dict(e) for e in issue.fix],
    }


# ---- grading and the per-episode state --------------------------------------------------------------------------


class Grader:
    """Grades an episode's sources against its repo's pristine tests through one SandboxPool, so the episodes
    running at once share the pool's concurrency limit."""

    def __init__(self, sandbox: dict[str, Any] | None = None, mode: str | None = None):
        from posttrain.sandbox import SandboxConfig, SandboxPool

        cfg = SandboxConfig(**{"timeout_s": 20.0, **(sandbox or {})})
        self.pool = SandboxPool(cfg)
        self.mode = mode  # None: out-of-process where the machine allows it
        # issue id -> the untouched code's per-test grade, kept once it came to a verdict (tasks/baselines.py)
        self.baselines = BaselineStore("coding-agent", cfg, _untouched, _issue_key, mode)

    async def __call__(self, kind: str, repo: str, sources: dict[str, str]) -> Any:
        return await self.pool.grade_pytest(sources, data.pristine_tests(kind, repo), mode=self.mode)

    async def start(self, row: dict[str, Any]) -> Baseline:
        """The row's baseline: its starting code graded to a verdict once per issue (normally up front by
        Task.prepare); an issue not settled yet gets one try here, through the episodes' pool."""
        return await self.baselines.get(row, self.pool)


def _untouched(row: dict[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    """What an issue's baseline grades: its starting sources against the pristine tests."""
    return dict(row["files"]), data.pristine_tests(row["kind"], row["repo"])


def _issue_key(row: dict[str, Any]) -> str:
    return row["issue_id"]


def episode_factory(grader: Grader, require_submit: bool = True, detect_hacks: bool = True):
    """Task.episode: a fresh RepoEpisode per rollout, on a copy of the row's starting sources."""

    def episode(row: dict[str, Any]) -> RepoEpisode:
        tests = data.pristine_tests(row["kind"], row["repo"])  # a fresh copy for the agent to read
        grade = functools.partial(grader, row["kind"], row["repo"])
        return RepoEpisode(
            row["files"], tests, grade, require_submit, detect_hacks, grade_start=functools.partial(grader.start, row)
        )

    return episode


# ---- rubric -----------------------------------------------------------------------------------------------------


def tests_passed(completions: list[Any], final_grade: list[Any] | None = None, **kwargs: Any) -> list[float]:
    """The submitted state's fraction of pristine tests passed (graded when the episode ended); 0 when it was
    not submitted or not graded (e.g. scored outside an episode)."""
    grades = final_grade if final_grade is not None else [None] * len(completions)
    return [float(g["score"]) if g else 0.0 for g in grades]


def issue_tests(
    completions: list[Any], final_grade: list[Any] | None = None, paid: bool = True, **kwargs: Any
) -> list[float | None]:
    """The default reward: issue_score (rewards/repair_grades.py) of the submitted state against the untouched code;
    0 when not submitted or not graded. A submitted state whose baseline is unknown (its grade kept failing:
    tasks/baselines.py) is no measurement: while this is the paid reward (`paid`), the sample fails with the
    reason and is kept out of training (issue_rewards)."""
    grades = final_grade if final_grade is not None else [None] * len(completions)
    return issue_rewards(
        [(Baseline(g.get("start_per_test"), g.get("start_error")), g.get("per_test")) if g else None for g in grades],
        paid,
    )


def grading_trust(completions: list[Any], final_grade: list[Any] | None = None, **kwargs: Any) -> list[float]:
    """1 out-of-process, 0 in-process, -1 not graded: logged (weight 0) so a run shows how it was graded."""
    grades = final_grade if final_grade is not None else [None] * len(completions)
    return [{"out-of-process": 1.0, "in-process": 0.0}.get(g["trust"], -1.0) if g else -1.0 for g in grades]


def hack_flagged(
    completions: list[Any],
    files: list[dict[str, str]] | None = None,
    final_files: list[Any] | None = None,
    **kwargs: Any,
) -> list[float]:
    """1 when the episode's edits added a reward hack (an early exit, frame introspection, a test-framework
    patch ...) that the starting code did not have."""
    if files is None or final_files is None:
        return [0.0] * len(completions)
    return [float(bool(f is not None and hack_flags(s, f))) for s, f in zip(files, final_files)]


def make_rubric(detect_hacks: bool = True, reward: str = "issue_tests") -> GuardedRubric:
    """`reward`: issue_tests (default) pays for the tests the issue breaks and keeps the others passing; tests_passed,
    the share of all tests, paid untouched code 0.33-0.71 on the held-out repos, and RL learned from it to stop editing
    (docs/results/tasks.md, "Coding agent"). Both are logged; `reward` says which one is paid."""
    check_repair_reward(reward)
    components = [
        RewardComponent("tests_passed", tests_passed, weight=float(reward == "tests_passed"), pass_threshold=1.0),
        RewardComponent(
            "issue_tests",
            functools.partial(issue_tests, paid=reward == "issue_tests"),
            weight=float(reward == "issue_tests"),
            pass_threshold=1.0,
        ),
        RewardComponent("grading_trust", grading_trust, weight=0.0, pass_threshold=0.0),
    ]
    if detect_hacks:  # pass_threshold 1.0: pass/hack_flagged is the flag rate
        components.append(RewardComponent("hack_flagged", hack_flagged, weight=0.0, pass_threshold=1.0))
    return GuardedRubric(components=components, pass_component="tests_passed", hack_name="hack_flagged")


# ---- demonstrations and smoke checks ----------------------------------------------------------------------------


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def line_edit(text: str, old: str, new: str) -> dict[str, Any]:
    """The edit `old -> new` on `text` as a line-range edit: {start_line, end_line, new} replacing only the lines
    that change. The text form makes a policy copy `old` exactly, docstring quotes JSON-escaped; the line form
    needs the line numbers read_file shows and the new lines only."""
    at = text.find(old)
    if at < 0 or text.find(old, at + 1) >= 0:
        raise ValueError(f"old text must occur exactly once in the file: {old[:80]!r}")
    lo = text.rfind("\n", 0, at) + 1  # whole lines around the span
    hi = text.find("\n", at + len(old))
    hi = len(text) if hi < 0 else hi
    old_lines = text[lo:hi].split("\n")
    new_lines = (text[lo:at] + new + text[at + len(old) : hi]).split("\n")
    head = 0  # lines both sides share, trimmed from each end; at least one old line is replaced
    while head < min(len(old_lines), len(new_lines)) - 1 and old_lines[head] == new_lines[head]:
        head += 1
    tail = 0
    while tail < min(len(old_lines), len(new_lines)) - head - 1 and old_lines[-1 - tail] == new_lines[-1 - tail]:
        tail += 1
    start = text.count("\n", 0, lo) + 1 + head
    kept_new = new_lines[head : len(new_lines) - tail]
    return {
        "start_line": start,
        "end_line": start + len(old_lines) - head - tail - 1,
        "new": "\n".join(kept_new) + "\n",
    }


def anchor_edit(text: str, old: str, new: str) -> dict[str, str]:
    """The edit `old -> new` on `text` as a short text edit: {old, new} where `old` is only the whole lines that
    change (line_edit's range), widened by a line above or below until it occurs once. A deletion issue's anchor
    is then its `    raise NotImplementedError` line, which the issue itself names, rather than the whole
    function with its docstring: the policy copies one short line and writes the new code in a block."""
    le = line_edit(text, old, new)
    lines = text.splitlines(keepends=True)
    lo, hi = le["start_line"] - 1, le["end_line"]  # lines[lo:hi] are replaced
    head, tail = "", ""
    while True:
        anchor = "".join(lines[lo:hi])
        if anchor.strip() and text.count(anchor) == 1:
            repl = head + le["new"] + tail
            if not anchor.endswith("\n"):  # the file's last line has no newline: neither does its replacement
                repl = repl.removesuffix("\n")
            return {"old": anchor, "new": repl}
        if lo > 0:  # widen upwards first (the line above a body is its def or docstring), then downwards
            lo -= 1
            head = lines[lo] + head
        elif hi < len(lines):
            tail += lines[hi]
            hi += 1
        else:
            raise ValueError(f"no unique anchor for the edit: {old[:80]!r}")


# ---- how a demonstration writes one fix {path, old, new} on the file's current text: task.options.demo_edits ----


def _text_call(text: str, e: dict[str, str]) -> str:
    return call("edit_file", path=e["path"], old=e["old"], new=e["new"])


def _lines_call(text: str, e: dict[str, str]) -> str:
    return call("edit_file", path=e["path"], **line_edit(text, e["old"], e["new"]))


def _blocks_call(text: str, e: dict[str, str]) -> str:
    le = line_edit(text, e["old"], e["new"])
    return fenced_block(le["new"], "python") + call(
        "edit_file", path=e["path"], start_line=le["start_line"], end_line=le["end_line"], new=BLOCK
    )


def _anchors_call(text: str, e: dict[str, str]) -> str:
    ae = anchor_edit(text, e["old"], e["new"])
    return fenced_block(ae["new"], "python") + call("edit_file", path=e["path"], old=ae["old"], new=BLOCK)


EDIT_CALLS = {"text": _text_call, "lines": _lines_call, "blocks": _blocks_call, "anchors": _anchors_call}
DEMO_EDITS = tuple(EDIT_CALLS)


def demonstrate(row: dict[str, Any], max_turns: int = 20, edits: str = "text") -> list[str]:
    """A correct episode for the warm start: read the file to fix, edit it, run the tests, submit. Fixed per
    row (replies cannot read tool results), so it is written from the row's own `fix` column. One call per
    reply; when `max_turns` is too short for all of it, the read and then the test run are left out (an episode
    that runs out of turns before submitting scores 0). `edits`: "text" replaces the exact old text, "lines"
    replaces the changed lines by number (line_edit), "blocks" does the same with the new lines in a fenced block
    before the call (no JSON escaping of code), "anchors" replaces the exact text of the changed lines (anchor_edit)
    with the new code in a block; the fixes are applied in order, so each line edit is computed on
    the file as the edits before it left it."""
    fix = row["fix"]
    if edits not in DEMO_EDITS:
        raise ValueError(f"demo_edits must be one of {DEMO_EDITS}, got {edits!r}")
    files, edit_calls = dict(row["files"]), []
    for e in fix:  # each edit is written against the file as the edits before it left it
        edit_calls.append(EDIT_CALLS[edits](files[e["path"]], e))
        files[e["path"]] = files[e["path"]].replace(e["old"], e["new"], 1)
    read, test = [call("read_file", path=fix[0]["path"])], [call("run_tests")]
    submit = [call("submit", summary=f"fixed {row['issue_id']}")]
    for replies in (read + edit_calls + test + submit, edit_calls + test + submit, edit_calls + submit):
        if len(replies) <= max_turns:
            return replies
    return edit_calls + submit  # longer than the episode: it cannot resolve, and the warm start says so


def smoke_checks(rows: list[dict[str, Any]], max_turns: int, demo_edits: str = "text") -> list[SmokeCheck]:
    """Known-good: the demonstration of the first issue of each kind resolves. Known-bad: submitting untouched
    code, and 'fixing' the issue by editing the tests (refused), do not."""
    firsts: list[dict[str, Any]] = []
    for kind in ("bug", "deletion"):
        firsts += [r for r in rows if r["kind"] == kind][:1]
    row = firsts[0]
    test_path = next(iter(data.pristine_tests(row["kind"], row["repo"])))
    edit_tests = call("edit_file", path=test_path, start_line=1, end_line=1, new="def test_nothing(): pass")
    checks = [
        SmokeCheck(f"demonstration resolves {r['issue_id']}", row=r, replies=demonstrate(r, max_turns, demo_edits))
        for r in firsts
    ]
    return checks + [
        SmokeCheck("submitting untouched code fails", row=row, replies=[call("submit")], expect="fail"),
        SmokeCheck(
            "editing the tests is refused and fails",
            row=row,
            expect="fail",
            replies=[edit_tests, call("run_tests"), call("submit")],
        ),
    ]


# ---- the task ---------------------------------------------------------------------------------------------------


def make_task(
    seed: int = 0,
    kinds: tuple[str, ...] | list[str] = data.KINDS,
    eval_repos: tuple[str, ...] | list[str] = DEFAULT_EVAL_REPOS,
    max_turns: int = 20,
    max_tokens: int = 512,
    require_submit: bool = True,
    detect_hacks: bool = True,
    sandbox: dict[str, Any] | None = None,
    grading_mode: str | None = None,
    tool_timeout_s: float = 60.0,
    demo_edits: str = "text",
    reward: str = "issue_tests",
) -> Task:
    """The `coding-agent` task. Rows of the repos in `eval_repos` are held out, all others train; deterministic
    (rows in repo, then file, order). `kinds` picks deletion and/or bug issues; `reward` what is paid
    (make_rubric)."""
    del seed
    if max_turns < 2:
        raise ValueError(f"max_turns must be >= 2 (an episode needs at least an edit and a submit), got {max_turns}")
    bad = [k for k in kinds if k not in data.KINDS]
    if bad or not kinds:
        raise ValueError(f"kinds must be a non-empty subset of {data.KINDS}, got {list(kinds)}")
    if demo_edits not in DEMO_EDITS:
        raise ValueError(f"demo_edits must be one of {DEMO_EDITS}, got {demo_edits!r}")
    rows = [make_row(i, demo_edits) for k in kinds for repo in data.repo_names(k) for i in data.issues(k, repo)]
    known = {repo for k in data.KINDS for repo in data.repo_names(k)}
    if set(eval_repos) - known:  # a repo of a kind left out of `kinds` is fine: it has no rows to hold out
        raise ValueError(f"eval_repos {sorted(set(eval_repos) - known)} are not shipped repos: {sorted(known)}")
    train = [r for r in rows if r["repo"] not in eval_repos]
    held = [r for r in rows if r["repo"] in eval_repos]
    if not train:
        raise ValueError("every repo is held out; nothing is left to train on")
    grader = Grader(sandbox, grading_mode)
    task = Task(
        name="coding-agent",
        train_rows=train,
        eval_rows=held,
        rubric=make_rubric(detect_hacks, reward),
        description=f"Fix an issue in a small Python repo with tools, over up to {max_turns} turns "
        f"({len(train)} train issues in {len({r['repo'] for r in train})} repos / {len(held)} held-out "
        f"in {len({r['repo'] for r in held})}); reward = "
        + (
            "the issue's failing tests fixed, other tests kept passing"
            if reward == "issue_tests"
            else "fraction of the pristine tests passed at submit"
        )
        + ".",
        max_tokens=max_tokens,
        stop=["</tool_call>"],  # one call per reply; the parser accepts the call without its closing tag
        tools=RepoEpisode({}, {}, None).tools,  # schemas for the prompt; each episode gets its own (episode=)
        episode=episode_factory(grader, require_submit, detect_hacks),
        max_turns=max_turns,
        final_tool="submit",
        tool_timeout_s=tool_timeout_s,
        demonstrate=functools.partial(demonstrate, max_turns=max_turns, edits=demo_edits),
        prepare=grader.baselines.prepare,
    )
    task.smoke_checks = smoke_checks(train, max_turns, demo_edits)
    return task
