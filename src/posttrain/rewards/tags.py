"""Behaviour tags (RISED): a rubric vocabulary shared across environments, and taggers that label each rollout.

A vocabulary is a list of tags, each a behaviour in words with a polarity:

    tags:
      - name: prose_around_json
        polarity: negative
        description: the answer has prose around the JSON
        rule: prose_around_json          # optional: a built-in rule or 'module:function'; none: the judge decides
      - name: only_json
        polarity: positive
        description: the answer is only the JSON value, with nothing around it

`RuleTagger` applies the tags that have a rule (a function `rule(trajectory) -> bool`, pure and cheap);
`JudgeTagger` asks an LLM judge (rewards/judges/) a yes/no question for the tags without one. A judge call that
fails leaves that sample's tag unknown (counted in `rised/tag_errors`), never the run. The built-in vocabulary
(`DEFAULT_VOCABULARY`) has rules for every tag, so tagging needs no judge unless a project adds tags.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from posttrain.errors import PosttrainError
from posttrain.types import Trajectory

Rule = Callable[[Trajectory], bool]


@dataclass(frozen=True)
class Tag:
    name: str
    polarity: Literal["positive", "negative"]
    description: str
    rule: str | None = None  # a BUILTIN_RULES name or 'module:function'


class VocabularyError(PosttrainError, ValueError):
    """A tag vocabulary that cannot be used: unreadable, a tag without a name, an unknown rule."""


# ---- built-in rules: read only what any trajectory has (its text, finish reason, components, extra) -----------------


def _text(t: Trajectory) -> str:
    return t.completion_text or ""


def truncated(t: Trajectory) -> bool:
    return t.turns[-1].finish_reason == "length"


def empty_answer(t: Trajectory) -> bool:
    return not _text(t).strip()


def invalid_json(t: Trajectory) -> bool:
    from posttrain.rewards.json_rewards import MISSING, parse_json_completion

    return parse_json_completion(_text(t))[0] is MISSING


def prose_around_json(t: Trajectory) -> bool:
    from posttrain.rewards.json_rewards import MISSING, parse_json_completion

    value, ok = parse_json_completion(_text(t))
    return value is not MISSING and ok < 1.0


def only_json(t: Trajectory) -> bool:
    from posttrain.rewards.json_rewards import parse_json_completion

    return parse_json_completion(_text(t))[1] == 1.0


def schema_violation(t: Trajectory) -> bool:
    return "json_schema" in t.reward_components and not invalid_json(t) and t.reward_components["json_schema"] < 1.0


def wrong_value(t: Trajectory) -> bool:
    return "json_values" in t.reward_components and not invalid_json(t) and t.reward_components["json_values"] < 1.0


def repeated_tool_call(t: Trajectory) -> bool:
    calls = [repr(c) for c in t.tool_calls]
    return len(calls) != len(set(calls))


def tool_error(t: Trajectory) -> bool:
    return t.metrics.get("tool_errors", 0.0) + t.metrics.get("malformed_calls", 0.0) > 0


def solved(t: Trajectory) -> bool:
    return t.passed


BUILTIN_RULES: dict[str, Rule] = {
    f.__name__: f
    for f in (
        truncated,
        empty_answer,
        invalid_json,
        prose_around_json,
        only_json,
        schema_violation,
        wrong_value,
        repeated_tool_call,
        tool_error,
        solved,
    )
}

# Shared across environments: a rule that does not apply to a task (no JSON, no tools) never fires there.
DEFAULT_VOCABULARY: list[Tag] = [
    Tag("solved", "positive", "the answer is correct", "solved"),
    Tag("only_json", "positive", "the answer is only the JSON value, with nothing around it", "only_json"),
    Tag("prose_around_json", "negative", "the answer has prose around the JSON", "prose_around_json"),
    Tag("invalid_json", "negative", "the answer is not valid JSON", "invalid_json"),
    Tag(
        "schema_violation",
        "negative",
        "a field has the wrong type or is missing (the schema is violated)",
        "schema_violation",
    ),
    Tag("wrong_value", "negative", "a field holds a wrong value", "wrong_value"),
    Tag("truncated", "negative", "the answer ran out of tokens before it ended", "truncated"),
    Tag("empty_answer", "negative", "the answer is empty (gave up)", "empty_answer"),
    Tag("repeated_tool_call", "negative", "the same tool call was repeated", "repeated_tool_call"),
    Tag("tool_error", "negative", "a tool call failed or was malformed", "tool_error"),
]


def resolve_rule(spec: str) -> Rule:
    if spec in BUILTIN_RULES:
        return BUILTIN_RULES[spec]
    if ":" not in spec:
        raise VocabularyError(f"unknown rule {spec!r}: a built-in ({', '.join(BUILTIN_RULES)}) or 'module:function'")
    mod, fn = spec.split(":", 1)
    try:
        return getattr(importlib.import_module(mod), fn)
    except (ImportError, AttributeError) as e:
        raise VocabularyError(f"rule {spec!r} cannot be imported: {e}") from None


def load_vocabulary(path: str | Path | None) -> list[Tag]:
    """A YAML vocabulary (`tags: [{name, polarity, description, rule?}]`); None: the built-in one."""
    if path is None:
        return list(DEFAULT_VOCABULARY)
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise VocabularyError(f"cannot read the tag vocabulary {path}: {e}") from None
    items = data.get("tags") if isinstance(data, dict) else None
    if not isinstance(items, list) or not items:
        raise VocabularyError(f"{path}: expected 'tags:' with a non-empty list of tags")
    tags, seen = [], set()
    for i, it in enumerate(items):
        if not isinstance(it, dict) or not isinstance(it.get("name"), str) or not it["name"].strip():
            raise VocabularyError(f"{path}: tag {i} needs a name")
        if it["name"] in seen:
            raise VocabularyError(f"{path}: tag {it['name']!r} appears twice")
        if it.get("polarity") not in ("positive", "negative"):
            raise VocabularyError(f"{path}: tag {it['name']!r}: polarity must be 'positive' or 'negative'")
        if not isinstance(it.get("description"), str) or not it["description"].strip():
            raise VocabularyError(f"{path}: tag {it['name']!r} needs a description (what the judge is asked)")
        rule = it.get("rule")
        if rule is not None:
            resolve_rule(str(rule))  # fail at load, not mid-run
        seen.add(it["name"])
        tags.append(Tag(it["name"], it["polarity"], it["description"], None if rule is None else str(rule)))
    return tags


@dataclass
class RuleTagger:
    """The tags with a rule, by their rule. A rule that raises leaves the tag unknown for that sample (counted)."""

    vocabulary: list[Tag]
    errors: int = 0
    _rules: dict[str, Rule] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self._rules = {t.name: resolve_rule(t.rule) for t in self.vocabulary if t.rule}

    def tag(self, trajs: list[Trajectory]) -> list[set[str]]:
        out: list[set[str]] = []
        for t in trajs:
            got = set()
            for name, rule in self._rules.items():
                try:
                    if rule(t):
                        got.add(name)
                except Exception:  # noqa: BLE001 - a project's rule may raise on odd output; the sample goes on
                    self.errors += 1
            out.append(got)
        return out


JUDGE_QUESTION = (
    "Here is a task and a reply.\nTask: {prompt}\nReply: {completion}\n\n"
    "Question: does the reply show this behaviour: {behaviour}? Answer Yes or No."
)


@dataclass
class JudgeTagger:
    """The tags without a rule, by an LLM judge's yes/no (P(Yes) >= threshold). Failed questions count as errors."""

    vocabulary: list[Tag]
    runner: Any  # a JudgeRunner
    threshold: float = 0.5
    errors: int = 0

    def tag(self, trajs: list[Trajectory]) -> list[set[str]]:
        tags = [t for t in self.vocabulary if not t.rule]
        out: list[set[str]] = [set() for _ in trajs]
        if not tags or not trajs:
            return out
        prompts, where = [], []
        for i, tr in enumerate(trajs):
            for tag in tags:
                prompts.append(
                    JUDGE_QUESTION.format(
                        prompt=str(tr.prompt_text)[-1500:], completion=_text(tr)[:1500], behaviour=tag.description
                    )
                )
                where.append((i, tag.name))
        try:
            answers = self.runner.ask("yes_no", JUDGE_QUESTION, prompts)
        except Exception:  # noqa: BLE001 - the judge is down altogether: every question unknown, the run goes on
            self.errors += len(prompts)
            return out
        for (i, name), a in zip(where, answers):
            if isinstance(a, Exception):
                self.errors += 1
            elif float(a) >= self.threshold:
                out[i].add(name)
        return out


@dataclass
class Taggers:
    """Rules first, then the judge for the rest; one set of tags per trajectory, stored in
    `Trajectory.guidance.tags`."""

    rules: RuleTagger
    judge: JudgeTagger | None = None

    def tag(self, trajs: list[Trajectory]) -> None:
        found = self.rules.tag(trajs)
        if self.judge is not None:
            found = [a | b for a, b in zip(found, self.judge.tag(trajs))]
        for t, tags in zip(trajs, found):
            t.guidance.tags = sorted(tags)

    @property
    def errors(self) -> int:
        return self.rules.errors + (self.judge.errors if self.judge is not None else 0)
