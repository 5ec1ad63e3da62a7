"""Group ranking: all G completions of a prompt in one judge call, as a group reward (`Task.group_rewards`).

The judge sees the candidates numbered [1]..[G] and answers with an order, best first, e.g. "3 > 1 > 2". The
answer's first line is parsed strictly (only candidate numbers and separators, every candidate exactly once;
`parse_ranking` in verdicts.py); anything else is malformed output and fails the group. Score: best 1.0, worst
0.0, linear in rank. Free-form, so it needs a capable judge (a served or hosted model); the small local default
does not write valid rankings reliably (docs/judges.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from posttrain.rewards.judges.errors import JudgeError
from posttrain.rewards.judges.prompting import check_template, fill, prompt_text
from posttrain.rewards.judges.runner import JudgeRunner
from posttrain.rewards.judges.verdicts import parse_ranking
from posttrain.rewards.text import completion_text

__all__ = ["DEFAULT_RANKING_QUESTION", "RankingJudge", "parse_ranking", "rank_scores"]

DEFAULT_RANKING_QUESTION = (
    "Task given to an assistant:\n{prompt}\n\nCandidate answers:\n{candidates}\n\n"
    "Rank the candidates from best to worst. Reply with only their numbers, best first, separated by '>' "
    "(for example: 2 > 1 > 3)."
)


def rank_scores(order: list[int]) -> list[float]:
    """Scores by candidate index from a best-first order: best 1.0, worst 0.0."""
    n = len(order)
    out = [0.0] * n
    for rank, idx in enumerate(order):
        out[idx] = 1.0 - rank / (n - 1) if n > 1 else 1.0
    return out


@dataclass
class RankingJudge:
    runner: JudgeRunner
    question: str = DEFAULT_RANKING_QUESTION  # {candidates}, optionally {prompt} and row columns
    name: str = "ranking_judge"
    max_tokens: int = 48

    def __post_init__(self) -> None:
        check_template(self.question, {"candidates"}, f"judge {self.name!r}")
        self.__name__ = self.name

    def __call__(self, completions: list[Any], prompts: list[Any] | None = None, **columns: list[Any]) -> list[float]:
        G = len(completions)
        if G < 2:
            return [1.0] * G
        cands = "\n".join(f"[{i + 1}] {completion_text(c)}" for i, c in enumerate(completions))
        row0 = {k: v[0] for k, v in columns.items() if isinstance(v, list) and v and k != "completion_ids"}
        q = fill(
            self.question,
            {**row0, "candidates": cands, "prompt": prompt_text(prompts[0]) if prompts else ""},
            f"judge {self.name!r}",
        )
        (ans,) = self.runner.ask(f"generate:{self.max_tokens}", self.question, [q], parse=lambda t: parse_ranking(t, G))
        if isinstance(ans, Exception):
            raise ans if isinstance(ans, JudgeError) else JudgeError(str(ans))
        return rank_scores(ans)

    def drain_metrics(self) -> dict[str, float]:
        return self.runner.stats.drain()
