"""A rubric that zeroes what the hack detector (rewards/hack_detector.py) flags, and logs the flag rate.

guard(rubric, code_of)        `rubric` plus a weight-0 `hack_flagged` component; a flagged sample gets reward
                              0 and does not pass
hack_component(code_of)       that component alone (its mean is the flag rate: `reward/hack_flagged`)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from posttrain.rewards.hack_detector import is_flagged
from posttrain.rewards.rubric import RewardComponent, Rubric, Score
from posttrain.rewards.text import completion_text

CodeOf = Callable[[str], "str | None"]


def hack_component(code_of: CodeOf, name: str = "hack_flagged") -> RewardComponent:
    """A weight-0 component that scores 1.0 for a flagged sample: its mean (`reward/hack_flagged`) is the
    flag rate. `code_of(text)` pulls the code out of a completion (None: no code, nothing to flag)."""

    def hack_flagged(completions: list[Any], **kwargs: Any) -> list[float]:
        return [1.0 if is_flagged(code_of(completion_text(c))) else 0.0 for c in completions]

    hack_flagged.__name__ = name
    # pass_threshold 1.0: `pass/hack_flagged` is the flag rate too (a pass here means "was flagged").
    return RewardComponent(name, hack_flagged, weight=0.0, pass_threshold=1.0)


@dataclass
class GuardedRubric(Rubric):
    """A Rubric whose samples flagged by `hack_name` get reward 0 and do not pass."""

    hack_name: str = "hack_flagged"

    def score(self, completions: list[Any], rows: list[dict[str, Any]], **extra: list[Any]) -> list[Score]:
        scores = super().score(completions, rows, **extra)
        others = [c for c in self.components if c.name != self.hack_name]
        for s in scores:
            if self.pass_component is None:  # "every component passes" must not include the flag itself
                s.passed = not s.failed and all(s.components[c.name] >= c.pass_threshold for c in others)
            if s.components.get(self.hack_name, 0.0) >= 1.0:
                s.reward, s.passed = 0.0, False
        return scores


def guard(rubric: Rubric, code_of: CodeOf, name: str = "hack_flagged") -> GuardedRubric:
    """`rubric` plus the hack component, with flagged samples zeroed."""
    return GuardedRubric(
        components=[*rubric.components, hack_component(code_of, name)],
        pass_component=rubric.pass_component,
        normalize=rubric.normalize,
        timeout_s=rubric.timeout_s,
        hack_name=name,
    )
