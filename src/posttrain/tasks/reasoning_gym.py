"""`reasoning_gym:<dataset>`: any of reasoning-gym's procedural datasets as a task, scored by its own scorer.

    task.name=reasoning_gym:leg_counting  task.options={min_animals: 1, max_animals: 2, train_size: 500}
    task.name=reasoning_gym:composite     task.options.datasets={chain_sum: {weight: 2}, gcd: {config: {...}}}

Options: posttrain's own (ReasoningGymOptions, config/task_options.py: checked when the config is); every other key
is the dataset's config (reasoning-gym's config dataclass for that dataset; `size` is an alias of `train_size`,
`seed` seeds the dataset).
Train and held-out rows are one dataset split by index (reasoning-gym seeds item i with seed + i, so the two ranges
never share a random stream), and held-out questions that also appear in training are dropped.

Rubric: `rg_score`, the dataset's own `score_answer` on the extracted answer (0..1, partial credit where the dataset
gives it; a sample passes at 1.0), plus `format` (the requested answer format is present) with a small weight.
Reward functions see only row columns, so a row carries its entry (`rg_entry`, JSON that keeps tuples and non-string
keys) and the spec that re-creates its dataset (`rg_spec`); the dataset object is built once per process and spec
(a small LRU cache), which also makes the reward work in another process (Ray env workers).

Model text is hostile and some scorers evaluate it (`eval` in four list-parsing scorers, sympy's `parse_expr` in
five expression scorers) or expand it (rubiks_cube's repeat counts): the answer is cut to MAX_ANSWER_CHARS, such
scorers only see answers that pass a syntax allowlist or a bound (`screen`), no scorer sees a NaN or an infinity,
and every call runs in a worker process that is killed past its timeout (reasoning_gym_screen.py). A scorer that
raises, times out, is screened or returns no finite number scores 0 for that sample; it never fails the batch.

The datasets and their specs: reasoning_gym_datasets.py; entries as JSON and the scorers' process:
_reasoning_gym_worker.py.
"""

from __future__ import annotations

import json
import re
import warnings
from typing import Any

from posttrain.bounded import BoundedError
from posttrain.config.formats import AnswerFormat
from posttrain.config.task_options import OptionsError, ReasoningGymOptions, parse
from posttrain.envs.smoke_checks import SmokeCheck
from posttrain.envs.task import Task, TaskLoadError
from posttrain.rewards.extract import completion_text, extract_answer, has_answer
from posttrain.rewards.rubric import RewardComponent, Rubric
from posttrain.tasks._reasoning_gym_worker import dumps_entry, loads_entry
from posttrain.tasks.reasoning_gym_datasets import build_dataset, dataset_spec, import_reasoning_gym
from posttrain.tasks.reasoning_gym_screen import (
    score_in_worker,
    scorer_pool,
    screen,
)

MAX_ANSWER_CHARS = 2000  # what a scorer sees at most of the extracted answer
SCORE_TIMEOUT_S = ReasoningGymOptions.model_fields["score_timeout_s"].default  # one score_answer call
BATCH_TIMEOUT_S = 30.0  # one reward call (a batch), under the rubric's reward_timeout_s (60 s by default)

# How each answer format is asked for (appended to the system prompt) and written (demonstrations, tests).
_INSTRUCTIONS: dict[AnswerFormat, str] = {  # one per format of config/formats.py (a test holds them equal)
    "auto": "Give your final answer between <answer> and </answer> tags, e.g. <answer>42</answer>.",
    "answer_tag": "Give your final answer between <answer> and </answer> tags, e.g. <answer>42</answer>.",
    "boxed": "Give your final answer as \\boxed{answer}, e.g. \\boxed{42}.",
    "last_line": "Give your final answer alone on the last line.",
    "last_number": "End your reply with the final answer as a number.",
    "none": "Reply with the final answer only, nothing else.",
}
DEFAULT_SYSTEM_PROMPT = "Answer the question. Think briefly if you need to."


def format_answer(answer: str, answer_format: str = "answer_tag") -> str:
    """`answer` written the way `answer_format` asks for it: what a model that got it right replies."""
    if answer_format in ("answer_tag", "auto"):
        return f"<answer>{answer}</answer>"
    if answer_format == "boxed":
        return f"\\boxed{{{answer}}}"
    return answer


# ------------------------------------------------------------------------------------------------------ scoring

_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:/\d+)?")  # a reference answer that is one number (fallback: last number)


class ScoreAnswer:
    """The headline reward: the dataset's own score_answer on the extracted answer, in [0, 1], 0 for no answer or a
    scorer that raises, times out, returns no finite number or may not see the answer. Counts those cases for the
    step's metrics. Scored in `pool`'s worker processes (the process's scorer_pool() by default)."""

    __name__ = "rg_score"

    def __init__(
        self,
        answer_format: str = "answer_tag",
        fallback: bool = True,
        timeout_s: float = SCORE_TIMEOUT_S,
        batch_timeout_s: float = BATCH_TIMEOUT_S,
        pool: Any = None,
    ):
        self.answer_format, self.fallback = answer_format, fallback
        self.timeout_s, self.batch_timeout_s, self.pool = timeout_s, batch_timeout_s, pool
        self.counts = {"timeouts": 0, "errors": 0, "screened": 0, "nonfinite": 0}

    def extract(self, text: str, reference: Any = None) -> str | None:
        """The answer in the requested format; without one (and with `fallback`), the last number when the
        reference is a number ("... so the total is 14."), else a box or the last line: what a small model that
        ignored the format wrote last."""
        got = extract_answer(text, self.answer_format)
        if got is None and self.fallback:
            numeric = isinstance(reference, str) and _NUMBER.fullmatch(reference.strip()) is not None
            got = extract_answer(text, "last_number" if numeric else "auto")
        return got[:MAX_ANSWER_CHARS] if got is not None else None

    def __call__(self, completions, rg_entry, rg_spec, answer=None, **kwargs) -> list[float]:
        refs = answer if answer is not None else [None] * len(completions)
        answers = [self.extract(completion_text(c), ref) for c, ref in zip(completions, refs)]
        return self.score(answers, rg_entry, rg_spec)

    def score(self, answers: list[str | None], entries: list[str], specs: list[str]) -> list[float]:
        """Each answer's score on its row (entry and spec JSON), all of them in one call to a worker."""
        values = [0.0] * len(answers)
        todo = []
        for i, (got, entry_json) in enumerate(zip(answers, entries)):
            if got is None:
                continue
            entry = loads_entry(entry_json)
            if screen(entry.get("metadata", {}).get("source_dataset", ""), got, entry.get("answer")):
                todo.append(i)
            else:
                self.counts["screened"] += 1
        rows = [(specs[i], entries[i], str(answers[i])) for i in todo]
        results = score_in_worker(self.pool or scorer_pool(), rows, self.timeout_s, self.batch_timeout_s)
        for i, r in zip(todo, results):
            if isinstance(r, str):
                self.counts[_COUNTED.get(r, "errors")] += 1
            else:
                values[i] = min(max(float(r), 0.0), 1.0)
        return values

    def score_one(self, answer: str | None, entry_json: str, spec_json: str) -> float:
        return self.score([answer], [entry_json], [spec_json])[0]

    def drain_metrics(self) -> dict[str, float]:
        out = {f"reasoning_gym/score_{k}": float(v) for k, v in self.counts.items() if v}
        self.counts = dict.fromkeys(self.counts, 0)
        return out


_COUNTED = {"timeout": "timeouts", "error": "errors", "nonfinite": "nonfinite"}


class FormatPresent:
    """Shaping: 1.0 when the reply gives its answer in the requested format (a closed, non-empty <answer> tag by
    default; extract.has_answer), else 0."""

    __name__ = "format"

    def __init__(self, answer_format: str = "answer_tag"):
        self.answer_format = "answer_tag" if answer_format == "auto" else answer_format

    def __call__(self, completions, **kwargs) -> list[float]:
        return [float(has_answer(completion_text(c), self.answer_format)) for c in completions]


# --------------------------------------------------------------------------------------------------------- rows


def _system_prompt(system_prompt: str | None, answer_format: AnswerFormat) -> str:
    """The system message: a named reasoning-gym prompt (SYSTEM_PROMPTS: default, direct, ...) as it is, or text
    (ours by default) followed by how to write the answer."""
    from reasoning_gym.utils import SYSTEM_PROMPTS

    if system_prompt in SYSTEM_PROMPTS:  # they all ask for <answer> tags
        tags = answer_format in ("answer_tag", "auto")
        return SYSTEM_PROMPTS[system_prompt].strip() + ("" if tags else "\n" + _INSTRUCTIONS[answer_format])
    base = DEFAULT_SYSTEM_PROMPT if system_prompt is None else system_prompt
    return f"{base}\n{_INSTRUCTIONS[answer_format]}".strip()


def _row(entry: dict[str, Any], system: str, spec_json: str) -> dict[str, Any]:
    messages = [{"role": "system", "content": system}] if system else []
    answer = entry.get("answer")
    return {
        "prompt": messages + [{"role": "user", "content": str(entry["question"])}],
        "answer": answer if isinstance(answer, str) else None,
        "rg_dataset": str(entry.get("metadata", {}).get("source_dataset", "")),
        "rg_entry": dumps_entry(entry),
        "rg_spec": spec_json,
    }


EVAL_POOL = 10  # held-out candidates looked at, per held-out row asked for (only a small problem space needs many)


def _split(dataset, train_size: int, eval_size: int) -> tuple[list[dict], list[dict]]:
    """Items [0, train_size) train; held-out from the items after them, skipping questions training also has
    (a small problem space repeats itself) and repeats among themselves."""
    train = [dataset[i] for i in range(train_size)]
    seen = {e["question"] for e in train}
    evals: list[dict] = []
    for i in range(train_size, train_size + EVAL_POOL * eval_size):
        if len(evals) == eval_size:
            break
        e = dataset[i]
        if e["question"] not in seen:
            seen.add(e["question"])
            evals.append(e)
    return train, evals


# ---------------------------------------------------------------------------------------------------- the task


def _warn_about(dataset_name: str, spec_json: str, entries: list[dict[str, Any]]) -> None:
    """Say so when rows can never pass (a reference longer than what extraction keeps) or every reply passes (a
    scorer that accepts nonsense: game_of_life_halting in 0.1.25 passes any non-empty answer). The probe is the
    first call to the scorers' worker: one that cannot start fails the task here, not at the first step."""
    long = sum(isinstance(e.get("answer"), str) and len(e["answer"]) > MAX_ANSWER_CHARS for e in entries)
    if long:
        warnings.warn(
            f"reasoning_gym:{dataset_name}: {long} of {len(entries)} reference answers are longer than "
            f"{MAX_ANSWER_CHARS} characters, which answer extraction cuts: those rows cannot pass; make the "
            "dataset's config easier",
            stacklevel=3,
        )
    probe = [(spec_json, dumps_entry(e), "?") for e in entries[:8]]
    try:
        got = score_in_worker(scorer_pool(), probe, SCORE_TIMEOUT_S, BATCH_TIMEOUT_S)
    except BoundedError as e:
        raise TaskLoadError(f"reasoning_gym:{dataset_name}: the scorers' worker process failed: {e}") from None
    if probe and all(not isinstance(r, str) and r >= 1.0 for r in got):
        warnings.warn(
            f"reasoning_gym:{dataset_name}: its scorer passes the answer '?' on every row tried: its pass "
            "rate measures nothing",
            stacklevel=3,
        )


def _smoke_checks(rows: list[dict[str, Any]], answer_format: str) -> list[SmokeCheck]:
    """The reference answer, written as asked, passes (when the dataset has one it can score); an empty reply fails."""
    checks = [SmokeCheck("an empty reply fails", row=rows[0], completion="", expect="fail")]
    ref = next((r for r in rows if r["answer"] and len(r["answer"]) <= MAX_ANSWER_CHARS), None)
    if ref is not None:
        checks.insert(
            0,
            SmokeCheck("the reference answer passes", row=ref, completion=format_answer(ref["answer"], answer_format)),
        )
    return checks


def make_task(dataset: str, **options: Any) -> Task:
    """A reasoning-gym dataset (or `composite`) as a Task; see the module docstring for the options."""
    import_reasoning_gym()
    try:  # posttrain's own options, checked as the config checks them (config/task_options.py)
        opts = parse(ReasoningGymOptions, options, "task.options")
    except OptionsError as e:
        raise TaskLoadError(f"reasoning_gym: {e}") from None
    n_train, n_eval, fmt = opts.train_size, opts.eval_size, opts.answer_format
    spec = dataset_spec(dataset, opts.config, n_train + EVAL_POOL * n_eval, opts.seed)
    built = build_dataset(spec)
    train, evals = _split(built, n_train, n_eval)
    spec_json = json.dumps(spec, sort_keys=True)
    _warn_about(dataset, spec_json, train + evals)
    if n_eval and not evals:
        raise TaskLoadError(
            f"reasoning_gym:{dataset}: every held-out question also appears in training (the "
            "config's problem space is that small); lower train_size or widen the config"
        )
    if len(evals) < n_eval:
        warnings.warn(
            f"reasoning_gym:{dataset}: only {len(evals)} of the {n_eval} held-out rows asked for are "
            "questions training does not have (a small problem space)",
            stacklevel=2,
        )
    system = _system_prompt(opts.system_prompt, fmt)
    train_rows = [_row(e, system, spec_json) for e in train]
    eval_rows = [_row(e, system, spec_json) for e in evals]
    score = ScoreAnswer(fmt, opts.fallback, opts.score_timeout_s)
    rubric = Rubric(
        [
            RewardComponent("rg_score", score),
            RewardComponent("format", FormatPresent(fmt), weight=opts.format_weight),
        ],
        pass_component="rg_score",
    )
    demonstrate = lambda row: [format_answer(row["answer"], fmt)] if row.get("answer") else []
    return Task(
        name=f"reasoning_gym:{dataset}",
        train_rows=train_rows,
        eval_rows=eval_rows,
        rubric=rubric,
        description=f"reasoning-gym {dataset}, scored by its own score_answer",
        max_tokens=opts.max_tokens,
        demonstrate=demonstrate,
        smoke_checks=_smoke_checks(train_rows, fmt),
    )
