"""`json-extract-judged`: the json-extract prompts, rewarded ONLY by an LLM judge; the programmatic verifiers stay
as the pass rates (weight 0), so the held-out metric is still checked by code.

Reward: a pointwise judge (rewards/judges/) asked a concrete yes/no question about the completion:
"Is the following text written as plain English sentences?". Its score is P(No) (`yes_means_pass=False`):
the judge is rewarded for *not* seeing prose. Why this question: the default 135M model, asked "is this text
JSON?" in two wordings, gave a *higher* P(Yes) to prose than to JSON (AUC 0.16-0.18 on 96 of its own samples);
whatever the question, its P(Yes) tracks "this is ordinary prose". Asking that directly, and rewarding No, uses
the signal it has in the direction the question means (docs/judges.md has the measurements).

Pass (the headline, `json_parse`): the whole completion is one JSON value (the property the judge is asked
about), so `posttrain judge audit` compares like with like. `pass/json_exact` is logged next to it: the
stricter json-extract pass.

Options: `judge_model` ('default', 'tiny-random', an HF folder; or the served model's name with
`judge_base_url`), `judge_base_url` (any OpenAI-compatible endpoint, e.g. `posttrain serve` or vLLM),
`judge_threshold` (the judge's pass threshold, for its pass rate and the audit), `judge_timeout_s` and
`judge_retries` (endpoint), `judge_local_timeout_s` (one local batch call), `group` ("pairwise": add the
pairwise judge as a group reward, asked in both orders). On a slow CPU raise `task.reward_timeout_s` (default
60 s) too: it bounds the whole judge call of a step's batch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol

from posttrain.envs.smoke_checks import SmokeCheck
from posttrain.envs.task import Task
from posttrain.envs.tool_env import tokenizable
from posttrain.rewards.json_rewards import json_exact, json_parse
from posttrain.rewards.judges import JudgeRunner, LocalHFBackend, OpenAIBackend, PairwiseJudge, PointwiseJudge
from posttrain.rewards.rubric import RewardComponent, Rubric
from posttrain.rewards.text import completion_text
from posttrain.tasks import json_extract

QUESTION = "Is the following text written as plain English sentences? Answer Yes or No.\n\n{completion}"
PAIR_QUESTION = "Text A:\n{a}\n\nText B:\n{b}\n\nIs text A more like JSON data than text B? Answer Yes or No."


# What the judge reads of a completion. The policy writes at most max_tokens (96) tokens, far less than this; but a
# judge's forward pass grows with the square of its prompt, and a local one that runs past its timeout keeps the
# model locked for every later call, so a reply of a megabyte stalled every step after it (issue #42). Characters
# are only the first, cheap cut: what must fit is the judge's context, in the judge's tokens (a byte-level tokenizer
# spends several tokens on one character, a character-level one a token on each), so a local judge cuts again by
# its own tokenizer to the room its context leaves (`JudgedClip`). A reply cut to fit is judged on its start and
# scores like any other reply; it never fails its sample for being long.
MAX_JUDGED_CHARS = 4000
# Tokens kept free beside the room: the " [...]" mark, and merges where the cut text meets the template's text.
CLIP_MARGIN_TOKENS = 16


class TokenRoom(Protocol):
    """A judge backend that can say how much quoted text its context holds (backends with a local tokenizer)."""

    def room(self, frame: str, new_tokens: int) -> int: ...

    def cut(self, text: str, tokens: int) -> str: ...


@dataclass
class JudgedClip:
    """What a judge reads of a completion: at most `max_chars` characters and, when `backend` has a tokenizer, at
    most the tokens its context leaves once the question `frame` and the answer's tokens are counted (shared by the
    `parts` completions one question quotes). A remote judge (no tokenizer here) gets the character cut only."""

    backend: TokenRoom | None = None
    max_chars: int = MAX_JUDGED_CHARS
    _rooms: dict[tuple[str, int], int] = field(default_factory=dict, repr=False)

    def tokens_for(self, frame: str, new_tokens: int, parts: int) -> int | None:
        if self.backend is None:
            return None
        key = (frame, new_tokens)
        if key not in self._rooms:  # one question template, one room: measured once
            self._rooms[key] = self.backend.room(frame, new_tokens)
        return max(0, self._rooms[key] // max(1, parts) - CLIP_MARGIN_TOKENS)

    def __call__(self, c: Any, frame: str, new_tokens: int = 1, parts: int = 1) -> Any:
        """`c` cut to what the judge can read, in the form it came in (text, or chat messages), with lone
        surrogates replaced (the judge's tokenizer raised UnicodeEncodeError on them)."""
        text = tokenizable(completion_text(c))
        cut = text[: self.max_chars]
        tokens = self.tokens_for(frame, new_tokens, parts)
        if tokens is not None and self.backend is not None:
            cut = self.backend.cut(cut, tokens)
        if cut != text:
            cut += " [...]"
        elif cut == completion_text(c):
            return c
        return cut if isinstance(c, str) else [{"role": "assistant", "content": cut}]


@dataclass
class ClippedPointwiseJudge(PointwiseJudge):
    """The pointwise judge on clipped completions (every path: rubric calls and the audit go through score_all)."""

    clip: JudgedClip = field(default_factory=JudgedClip)

    def score_all(
        self, completions: list[Any], prompts: list[Any] | None = None, **columns: list[Any]
    ) -> list[float | Exception]:
        frame = self.question.replace("{completion}", "")
        new_tokens = 1 if self.mode == "yes_no" else self.max_tokens
        return super().score_all([self.clip(c, frame, new_tokens) for c in completions], prompts, **columns)


@dataclass
class ClippedPairwiseJudge(PairwiseJudge):
    """The pairwise judge on clipped completions: the two share the room its context leaves."""

    clip: JudgedClip = field(default_factory=JudgedClip)

    def compare_many(
        self,
        pairs: list[tuple[Any, Any]],
        prompts: list[Any] | None = None,
        columns: list[dict[str, Any]] | None = None,
    ) -> list[Any]:
        frame = self.question.replace("{a}", "").replace("{b}", "")
        return super().compare_many(
            [(self.clip(a, frame, 1, 2), self.clip(b, frame, 1, 2)) for a, b in pairs], prompts, columns
        )


def make_backend(
    judge_model: str = "default",
    judge_base_url: str | None = None,
    judge_api_key: str | None = None,
    judge_timeout_s: float = 30.0,
) -> OpenAIBackend | LocalHFBackend:
    if judge_base_url:
        return OpenAIBackend(
            judge_base_url,
            model=None if judge_model == "default" else judge_model,
            api_key=judge_api_key,
            timeout_s=judge_timeout_s,
        )
    return LocalHFBackend(judge_model)


def make_task(
    seed: int = 0,
    n_train: int = 400,
    n_eval: int = 48,
    judge_model: str = "default",
    judge_base_url: str | None = None,
    judge_api_key: str | None = None,
    judge_threshold: float = 0.5,
    judge_timeout_s: float = 30.0,
    judge_retries: int = 2,
    judge_local_timeout_s: float = 600.0,
    group: str | None = None,
) -> Task:
    if group not in (None, "pairwise"):
        raise ValueError(f"group must be None or 'pairwise', got {group!r}")
    base = json_extract.make_task(seed=seed, n_train=n_train, n_eval=n_eval)
    backend = make_backend(judge_model, judge_base_url, judge_api_key, judge_timeout_s)
    if judge_base_url:
        runner = lambda: JudgeRunner(backend, timeout_s=2 * judge_timeout_s, max_retries=judge_retries)
    else:
        # In process nothing is transient, and a timed-out forward keeps the model's lock until it ends, so a
        # retry would only queue behind it: one attempt, with a timeout sized for a slow shared CPU.
        runner = lambda: JudgeRunner(backend, batch_size=8, timeout_s=judge_local_timeout_s, max_retries=0)
    # A local judge cuts what it reads by its own tokens; a remote one (no tokenizer here) by characters.
    clip = JudgedClip(backend if isinstance(backend, LocalHFBackend) else None)
    judge = ClippedPointwiseJudge(runner(), QUESTION, name="judge", yes_means_pass=False, clip=clip)
    pairwise = ClippedPairwiseJudge(runner(), PAIR_QUESTION, name="pairwise_judge", clip=clip)
    rubric = Rubric(
        [
            RewardComponent("judge", judge, weight=1.0, pass_threshold=judge_threshold),
            # Weight 0: measured, never rewarded. The pass component is the verifier of what the judge is asked.
            RewardComponent("json_parse", json_parse, weight=0.0, pass_threshold=1.0),
            RewardComponent("json_exact", json_exact, weight=0.0, pass_threshold=1.0),
        ],
        pass_component="json_parse",
    )
    first = base.train_rows[0]
    return Task(
        name="json-extract-judged",
        train_rows=base.train_rows,
        eval_rows=base.eval_rows,
        rubric=rubric,
        description="json-extract rewarded only by an LLM judge (is it prose? reward P(No)); pass = only JSON",
        max_tokens=base.max_tokens,
        stop=list(base.stop),
        smoke_checks=[
            SmokeCheck("the expected JSON passes", row=first, completion=json.dumps(first["expected"])),
            SmokeCheck("prose fails", row=first, completion="Here is the data you asked for.", expect="fail"),
        ],
        group_rewards=[pairwise] if group == "pairwise" else [],
        judges={"judge": judge, "pairwise_judge": pairwise},
    )
