"""Pairwise judging: which of two completions is better, asked in both orders; as a group reward, a round robin.

A judge that prefers whichever answer comes first (or second) is common, and strongest in small models. Every
pair is therefore asked twice, (a, b) and (b, a); P(a better) is the mean of P(first better | a first) and
1 - P(first better | b first), so a pure position preference cancels out. When the two orders give opposite
verdicts (both say "first", or both say "second") the pair is a **position flip**: counted in
`judge/position_flips` (of `judge/pairs`) and logged at debug level.

The question template has `{a}` and `{b}` (the two completions, in the order asked), optionally `{prompt}` and
row columns, and is a yes/no question "is A better than B?" (backend yes_prob), e.g.

    'Task: {prompt}\\nAnswer A: {a}\\nAnswer B: {b}\\nIs answer A better than answer B? Answer Yes or No.'

As a group reward (`Task.group_rewards`), a completion's score is its mean P(win) against the G - 1 others.
Each order's answer must be a finite P(Yes) in [0, 1] (verdicts.probability), else that pair, and so the group,
fails: a NaN would otherwise spread to every score of the group.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass
from typing import Any

from posttrain.rewards.judges.errors import JudgeError
from posttrain.rewards.judges.prompting import check_template, fill, prompt_text
from posttrain.rewards.judges.runner import JudgeRunner
from posttrain.rewards.judges.verdicts import probability
from posttrain.rewards.text import completion_text

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PairVerdict:
    p_a: float  # P(a better than b), position-debiased
    first_order: float  # P(first better) with a first
    second_order: float  # P(first better) with b first
    flipped: bool  # the two orders disagree about which answer is better


def pair_verdict(p_first_ab: float, p_first_ba: float) -> PairVerdict:
    """Combine the two orders (pure). A flip: both orders prefer the same position (ties at 0.5 count as no
    preference, so not a flip)."""
    a_wins_1, a_wins_2 = p_first_ab - 0.5, 0.5 - p_first_ba
    flipped = a_wins_1 * a_wins_2 < 0
    return PairVerdict((p_first_ab + (1.0 - p_first_ba)) / 2.0, p_first_ab, p_first_ba, flipped)


@dataclass
class PairwiseJudge:
    runner: JudgeRunner
    question: str
    name: str = "pairwise_judge"

    def __post_init__(self) -> None:
        check_template(self.question, {"a", "b"}, f"judge {self.name!r}")
        self.__name__ = self.name

    def compare_many(
        self,
        pairs: list[tuple[Any, Any]],
        prompts: list[Any] | None = None,
        columns: list[dict[str, Any]] | None = None,
    ) -> list[PairVerdict | Exception]:
        """One verdict per (a, b) pair; both orders of every pair go out in one batched ask."""
        qs = []
        for i, (a, b) in enumerate(pairs):
            base = {**(columns[i] if columns else {}), "prompt": prompt_text(prompts[i]) if prompts else ""}
            for x, y in ((a, b), (b, a)):
                qs.append(
                    fill(
                        self.question,
                        {**base, "a": completion_text(x), "b": completion_text(y)},
                        f"judge {self.name!r}",
                    )
                )
        ans = self.runner.ask("yes_no", self.question, qs, parse=probability)  # finite, in [0, 1], or a failure
        out: list[PairVerdict | Exception] = []
        flips = 0
        for i in range(len(pairs)):
            p1, p2 = ans[2 * i], ans[2 * i + 1]
            if isinstance(p1, Exception) or isinstance(p2, Exception):
                out.append(p1 if isinstance(p1, Exception) else p2)
                continue
            v = pair_verdict(p1, p2)
            flips += v.flipped
            if v.flipped:
                log.debug(
                    "judge %s: position flip (P(first better) %.2f with a first, %.2f with b first)", self.name, p1, p2
                )
            out.append(v)
        self.runner.stats.add(pairs=sum(1 for v in out if isinstance(v, PairVerdict)), position_flips=flips)
        return out

    def __call__(self, completions: list[Any], prompts: list[Any] | None = None, **columns: list[Any]) -> list[float]:
        """Group reward: each completion's mean P(win) over the others. One failed pair fails the group (a
        ranking with a hole would be biased), which score_groups turns into that group's samples failing."""
        G = len(completions)
        if G < 2:
            return [0.5] * G
        pairs = list(itertools.combinations(range(G), 2))
        cols = {k: v for k, v in columns.items() if isinstance(v, list) and len(v) == G and k != "completion_ids"}
        row0 = {k: v[0] for k, v in cols.items()}
        verdicts = self.compare_many(
            [(completions[i], completions[j]) for i, j in pairs],
            [prompts[0] if prompts else None] * len(pairs),
            [row0] * len(pairs),
        )
        wins = [0.0] * G
        for (i, j), v in zip(pairs, verdicts):
            if isinstance(v, Exception):
                raise JudgeError(f"pairwise judge {self.name!r} failed on a pair: {v}") from v
            wins[i] += v.p_a
            wins[j] += 1.0 - v.p_a
        return [w / (G - 1) for w in wins]

    def drain_metrics(self) -> dict[str, float]:
        return self.runner.stats.drain()
