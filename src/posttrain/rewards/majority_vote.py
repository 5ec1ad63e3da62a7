"""Test-time RL (TTRL): the reward of a completion is whether its answer agrees with the majority answer of its
group. No label is read: the group is its own verifier (docs/ttrl.md).

    extract(text) -> answer | None            EXTRACTORS: last_number, boxed, last_line, exact
    majority_vote(answers, tie) -> Vote       pure: the majority answer, its count, whether it was a tie
    MajorityVoteReward(extract)               a Task.group_rewards function; refuses label columns
    LabelAudit(labels, extract, votes)        held-out only: pass@1 and whether the majority was right

Tie rule: completions without an answer (extract returned None) do not vote. Among the answers with the most
votes, `tie="first"` (default) takes the one that appears first in the group: deterministic, and since the G
samples are exchangeable it picks among the tied answers uniformly at random over groups. `tie="none"` gives no
majority on a tie: every completion of that group scores 0 (no signal rather than a coin flip).
"""

from __future__ import annotations

import re
import threading
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from posttrain.errors import PosttrainError
from posttrain.rewards.text import completion_text

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
TIE_RULES = ("first", "none")
SMOKE_PREFIX = "smoke-"  # row ids of `posttrain env check` rows: LabelAudit scores them without counting them


def _canonical_number(s: str) -> str:
    """'12', '12.0' and '012' are one answer; '12.5' stays itself."""
    f = float(s)
    return str(int(f)) if f.is_integer() else repr(f)


def last_number(text: str) -> str | None:
    found = _NUMBER.findall(text)
    return _canonical_number(found[-1]) if found else None


def boxed(text: str) -> str | None:
    found = _BOXED.findall(text)
    return found[-1].strip() if found else None


def last_line(text: str) -> str | None:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1].lower() if lines else None


def exact(text: str) -> str | None:
    return text.strip() or None


EXTRACTORS: dict[str, Callable[[str], str | None]] = {
    "last_number": last_number,
    "boxed": boxed,
    "last_line": last_line,
    "exact": exact,
}


@dataclass(frozen=True)
class Vote:
    label: str | None  # the majority answer (None: nobody answered, or a tie under tie="none")
    count: int  # votes for it
    voters: int  # completions with an answer
    tie: bool  # several answers shared the top count


def majority_vote(answers: list[str | None], tie: str = "first") -> Vote:
    if tie not in TIE_RULES:
        raise ValueError(f"tie must be one of {TIE_RULES}, got {tie!r}")
    valid = [a for a in answers if a is not None]
    if not valid:
        return Vote(None, 0, 0, False)
    counts = Counter(valid)
    top = max(counts.values())
    tied = [a for a in dict.fromkeys(valid) if counts[a] == top]  # in order of first appearance
    is_tie = len(tied) > 1
    if is_tie and tie == "none":
        return Vote(None, top, len(valid), True)
    return Vote(tied[0], top, len(valid), is_tie)


def agreement_rewards(answers: list[str | None], vote: Vote) -> list[float]:
    return [float(vote.label is not None and a == vote.label) for a in answers]


class LabelLeakError(PosttrainError, RuntimeError):
    """A label column reached the training reward: TTRL must not see labels."""


class MajorityVoteReward:
    """Task.group_rewards function: 1 for a completion whose answer equals its group's majority answer, else 0.

    It never reads a column: the row's columns arrive as keyword arguments (score_groups' convention) and are
    ignored, and one named in `label_columns` makes it raise, so a task that forgot to strip its labels fails loudly
    instead of quietly training on them. Each group's vote is kept in `log` (bounded) for the held-out audit."""

    __name__ = "majority_vote"

    def __init__(
        self,
        extract: Callable[[str], str | None],
        tie: str = "first",
        label_columns: tuple[str, ...] = ("answer",),
        id_column: str = "ttrl_id",
    ):
        majority_vote([], tie)  # validates the rule now
        self.extract, self.tie, self.label_columns, self.id_column = extract, tie, tuple(label_columns), id_column
        self._lock = threading.Lock()
        self._stats = Counter()
        self.log: deque[tuple[Any, Vote]] = deque(maxlen=100_000)

    def __call__(self, completions: list[Any], prompts: list[Any] | None = None, **columns: Any) -> list[float]:
        leaked = [c for c in self.label_columns if c in columns]
        if leaked:
            raise LabelLeakError(f"label column(s) {leaked} reached the TTRL reward; strip them from the rows")
        answers = [self.extract(completion_text(c)) for c in completions]
        vote = majority_vote(answers, self.tie)
        ids = columns.get(self.id_column) or [None]
        with self._lock:
            self._stats.update(
                groups=1,
                completions=len(answers),
                no_answer=sum(a is None for a in answers),
                majority_votes=vote.count if vote.label is not None else 0,
                ties=int(vote.tie),
            )
            self.log.append((ids[0], vote))
        return agreement_rewards(answers, vote)

    def drain_metrics(self) -> dict[str, float]:
        with self._lock:
            s, self._stats = self._stats, Counter()
        if not s["groups"]:
            return {}
        return {
            "ttrl/groups": float(s["groups"]),
            "ttrl/majority_share": s["majority_votes"] / max(s["completions"], 1),  # of all G, no-answers too
            "ttrl/no_answer": s["no_answer"] / max(s["completions"], 1),
            "ttrl/ties": s["ties"] / s["groups"],
        }


class LabelAudit:
    """Rubric component (weight 0: it never changes a reward) that knows the held-out labels, by row id, and
    nothing else. On a held-out row it scores label agreement (its pass rate is pass@1); on a training row, whose
    label was dropped, it scores 0 and records nothing. `drain_metrics` reports pass@1 and how often the group's
    majority answer was right (maj@n, n = completions per held-out prompt), read from the votes' log."""

    __name__ = "label_match"

    def __init__(
        self,
        labels: dict[Any, str],
        extract: Callable[[str], str | None],
        votes: MajorityVoteReward,
        id_column: str = "ttrl_id",
    ):
        self.labels, self.extract, self.votes, self.id_column = dict(labels), extract, votes, id_column
        self._lock = threading.Lock()
        self._hits: list[float] = []

    def __call__(self, completions: list[Any], **columns: Any) -> list[float]:
        ids = columns.get(self.id_column) or [None] * len(completions)
        out, hits = [], []
        for c, i in zip(completions, ids):
            if i in self.labels:
                hit = float(self.extract(completion_text(c)) == self.labels[i])
                if not str(i).startswith(SMOKE_PREFIX):  # env-check rows are scored, never counted
                    hits.append(hit)
                out.append(hit)
            else:
                out.append(0.0)
        with self._lock:
            self._hits += hits
        return out

    def drain_metrics(self) -> dict[str, float]:
        with self._lock:
            hits, self._hits = self._hits, []
        votes = []
        while self.votes.log:
            votes.append(self.votes.log.popleft())
        labelled = [(self.labels[i], v) for i, v in votes if i in self.labels]
        out: dict[str, float] = {}
        if hits:
            out["ttrl/pass_at_1"] = sum(hits) / len(hits)
        if labelled:
            out["ttrl/majority_correct"] = sum(v.label == lab for lab, v in labelled) / len(labelled)
            out["ttrl/labelled_groups"] = float(len(labelled))
        return out
