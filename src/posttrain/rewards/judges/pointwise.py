"""Pointwise judging: each completion scored on its own, as a rubric component (TRL reward signature).

    judge = PointwiseJudge(runner, 'Does the reply contain the word "{word}"?\\nReply: {completion}\\n...')
    Rubric([RewardComponent("judge", judge), ...])     # mixes with gates and programmatic scores

Two modes:
- `yes_no` (default): the question is a concrete yes/no question; the score is P(Yes) / (P(Yes) + P(No)) of the
  judge's first answer token (backends.py). Reliable even for a 135M judge, and a graded reward.
- `score`: the judge writes a number from 0 to `max_score` (parsed strictly: the answer's first line is the number,
  optionally "score:" before it and "/max_score" after it; verdicts.py); the reward is number / max_score. Needs a
  capable judge (a hosted or vLLM-served model).

A sample whose judge call failed (endpoint down, timeout, malformed answer, a P(Yes) that is not a finite number in
[0, 1]) fails alone: the judge raises `PartialRewardFailure`, which the rubric turns into failed samples without
calling again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from posttrain.rewards.judges.prompting import check_template, fill, prompt_text, row_values
from posttrain.rewards.judges.runner import JudgeRunner
from posttrain.rewards.judges.verdicts import parse_score, probability
from posttrain.rewards.rubric import PartialRewardFailure

__all__ = ["PointwiseJudge", "parse_score"]


def p_no(x: Any) -> float:
    """The score when "Yes" is the bad answer: P(No), from a checked P(Yes)."""
    return 1.0 - probability(x)


@dataclass
class PointwiseJudge:
    runner: JudgeRunner
    question: str  # the template: {completion}, optionally {prompt} and row columns
    name: str = "judge"
    mode: Literal["yes_no", "score"] = "yes_no"
    max_score: float = 10.0
    max_tokens: int = 8  # score mode: tokens the judge may write
    # yes_no mode: False when "Yes" is the bad answer ("Is this text prose?"), so the score is P(No). Ask the
    # question the judge answers best, in whichever direction; the audit shows which one that is.
    yes_means_pass: bool = True

    def __post_init__(self) -> None:
        if self.mode not in ("yes_no", "score"):
            raise ValueError(f"mode must be 'yes_no' or 'score', got {self.mode!r}")
        if not (math.isfinite(self.max_score) and self.max_score > 0):
            raise ValueError(f"max_score must be a finite number > 0, got {self.max_score}")
        check_template(self.question, {"completion"}, f"judge {self.name!r}")
        self.__name__ = self.name  # the rubric names a component after its function's __name__

    @property
    def kind(self) -> str:
        return "yes_no" if self.mode == "yes_no" else f"generate:{self.max_tokens}"

    def questions(self, completions: list[Any], prompts: list[Any] | None = None, **columns: list[Any]) -> list[str]:
        cols = {k: v for k, v in columns.items() if k not in ("completion_ids",)}
        return [
            fill(
                self.question,
                {**row_values(i, cols), "completion": c, "prompt": prompt_text(prompts[i]) if prompts else ""},
                f"judge {self.name!r}",
            )
            for i, c in enumerate(completions)
        ]

    def score_all(
        self, completions: list[Any], prompts: list[Any] | None = None, **columns: list[Any]
    ) -> list[float | Exception]:
        """One score in [0, 1] per completion, or the error that kept it from being judged."""
        if self.mode == "score":
            parse = lambda x: parse_score(x, self.max_score)
        else:
            parse = probability if self.yes_means_pass else p_no
        return self.runner.ask(self.kind, self.question, self.questions(completions, prompts, **columns), parse=parse)

    def __call__(self, completions: list[Any], prompts: list[Any] | None = None, **columns: list[Any]) -> list[float]:
        out = self.score_all(completions, prompts, **columns)
        errors = {i: f"{type(v).__name__}: {v}" for i, v in enumerate(out) if isinstance(v, Exception)}
        values: list[float | None] = [None if isinstance(v, Exception) else v for v in out]
        if errors:
            raise PartialRewardFailure(values, errors)
        return [v for v in out if not isinstance(v, Exception)]  # no errors: every one is a float

    def drain_metrics(self) -> dict[str, float]:
        return self.runner.stats.drain()
