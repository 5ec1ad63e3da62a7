"""RLTL;DR: the policy writes itself a short insight after a failed attempt, and later attempts read them.

    memory   = InsightMemory(per_task, max_tasks)       bounded; saved in the stepper's checkpoint state
    env      = InsightEnv(task_env, memory, cfg)        what the collector rolls out through
      rollout(row):   insights for this row in memory?  a share of rollouts sees them (appended to the prompt's
                      last message), the rest do not and carry them as a teacher hint (internalisation)
      score(trajs):   the task's rubric and feedback, then, for up to `per_group` failed samples of each row, the
                      policy writes an insight (one batched sampler call) that goes into the memory

Internalisation trains the unconditioned policy toward the insight-conditioned one: an unconditioned rollout's
teacher is the policy itself with the row's insights in the same place the conditioned rollouts read them
(loop/teacher.SelfHintTeacher, a per-token reverse KL on the student's own tokens; the hint is
`Trajectory.guidance.teacher_hint`, read by loop/batch.py `env_hint`). The held-out eval reports
pass@1 without insights (the plain eval) and with them (`eval/insights/pass_rate`: each failed first attempt
writes an insight and is tried again with it in context; a first attempt that passed counts as passed).
`posttrain sft RUN_DIR/insights.jsonl` trains on a run's (task, insight) pairs with no rollouts (SFTL;DR;
train/sft.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
from collections import OrderedDict
from dataclasses import replace
from pathlib import Path
from typing import Any

from posttrain.bounded import truncate_text
from posttrain.envs.base import TaskEnv
from posttrain.envs.feedback import attach_feedback
from posttrain.envs.scoring import NotedScore, scored
from posttrain.rewards.rubric import Score
from posttrain.sampling.base import Sampler
from posttrain.sampling.context import ContextOverflow
from posttrain.types import SampleParams, Trajectory

# What of an attempt and its feedback the insight prompt quotes (a completion is bounded by max_tokens, a feedback
# text, e.g. a test log, is not).
MAX_ATTEMPT_CHARS = 4000
MAX_FEEDBACK_CHARS = 2000

WRITE_INSTRUCTION = (
    "Your attempt above was wrong. In one short sentence, write a TL;DR insight: advice to "
    "yourself that would make your next attempt at this task succeed. Reply with the sentence only."
)
BLOCK_HEADER = "\n\nNotes from your earlier attempts:"


def row_key(row: dict[str, Any]) -> str:
    """A task row's identity in the memory: its prompt (rows with the same prompt share insights)."""
    return hashlib.sha1(json.dumps(row.get("prompt"), sort_keys=True, default=str).encode()).hexdigest()[:16]


def insight_block(insights: list[str]) -> str:
    """How insights are written into a prompt (and into the internalisation teacher's context, identically)."""
    return BLOCK_HEADER + "".join(f"\n- {x}" for x in insights)


def append_to_prompt(row: dict[str, Any], text: str) -> dict[str, Any]:
    """A copy of the row with `text` appended to the prompt's last message (or to a text prompt)."""
    prompt = row["prompt"]
    if isinstance(prompt, str):
        return {**row, "prompt": prompt + text}
    msgs = [dict(m) for m in prompt]
    msgs[-1]["content"] = str(msgs[-1].get("content", "")) + text
    return {**row, "prompt": msgs}


def condition_row(row: dict[str, Any], insights: list[str]) -> dict[str, Any]:
    """The row with its insights appended to the prompt's last message (or to a text prompt)."""
    return append_to_prompt(row, insight_block(insights)) if insights else row


def clean_insight(text: str, max_chars: int = 240) -> str | None:
    """The first non-empty line, trimmed; None when nothing usable was written."""
    line = next((x.strip(" -*\t") for x in text.strip().splitlines() if x.strip(" -*\t")), "")
    return line[:max_chars] or None


class InsightMemory:
    """Up to `per_task` insights per task row (the newest kept) for up to `max_tasks` rows (least recently
    written dropped first). Both bounds hold whatever the run writes."""

    def __init__(self, per_task: int = 3, max_tasks: int = 10_000):
        if per_task < 1 or max_tasks < 1:
            raise ValueError(f"insight memory bounds must be >= 1, got per_task={per_task}, max_tasks={max_tasks}")
        self.per_task, self.max_tasks = per_task, max_tasks
        self._m: OrderedDict[str, list[str]] = OrderedDict()
        self.prompts: dict[str, Any] = {}  # key -> the row's prompt, for (task, insight) pairs (SFTL;DR)

    def add(self, key: str, insight: str, prompt: Any = None) -> None:
        items = [x for x in self._m.pop(key, []) if x != insight] + [insight]
        self._m[key] = items[-self.per_task :]
        if prompt is not None:
            self.prompts[key] = prompt
        while len(self._m) > self.max_tasks:
            old, _ = self._m.popitem(last=False)
            self.prompts.pop(old, None)

    def get(self, key: str) -> list[str]:
        return list(self._m.get(key, []))

    def __len__(self) -> int:
        return len(self._m)

    def metrics(self, trajs: list[Trajectory]) -> dict[str, float]:
        """The stepper's plugin interface: the memory's size each step."""
        return {"insights/memory_tasks": float(len(self))}

    def pairs(self) -> list[dict[str, Any]]:
        """(task, insight) rows for supervised training: the prompt and one insight each."""
        return [{"prompt": self.prompts[k], "insight": x} for k, xs in self._m.items() if k in self.prompts for x in xs]

    def state_dict(self) -> dict[str, Any]:
        return {
            "per_task": self.per_task,
            "max_tasks": self.max_tasks,
            "items": [[k, v] for k, v in self._m.items()],
            "prompts": self.prompts,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._m = OrderedDict((k, list(v)[-self.per_task :]) for k, v in state.get("items", []))
        while len(self._m) > self.max_tasks:
            self._m.popitem(last=False)
        self.prompts = {k: v for k, v in state.get("prompts", {}).items() if k in self._m}


def write_prompt(row: dict[str, Any], attempt: str, feedback: str | None) -> list[dict[str, str]]:
    """The chat the policy writes an insight in: the task, its attempt, what was wrong when known."""
    prompt = row["prompt"]
    task = prompt if isinstance(prompt, str) else "\n".join(str(m.get("content", "")) for m in prompt)
    body = f"{task}\n\nYour attempt:\n{truncate_text(attempt, MAX_ATTEMPT_CHARS)[0]}"
    if feedback:  # a test log or a tool's error: bounded, so the prompt stays within the context
        body += f"\n\nWhat was wrong: {truncate_text(feedback, MAX_FEEDBACK_CHARS)[0]}"
    return [{"role": "user", "content": f"{body}\n\n{WRITE_INSTRUCTION}"}]


async def write_insights(
    sampler: Sampler, tokenizer: Any, trajs: list[Trajectory], params: SampleParams
) -> list[str | None]:
    """One insight per trajectory, written by the policy; the calls are coalesced into one batch by the sampler. A
    prompt that does not fit the context (ContextOverflow) writes no insight for its trajectory alone."""
    from posttrain.models.template_check import render_ids

    if not trajs:
        return []
    prompts = [
        render_ids(
            tokenizer,
            write_prompt(t.extra.get("base_row", t.row), t.completion_text, t.feedback),
            add_generation_prompt=True,
        )
        for t in trajs
    ]
    outs = await asyncio.gather(*(sampler.sample([p], params, n=1) for p in prompts), return_exceptions=True)
    for o in outs:
        if isinstance(o, BaseException) and not isinstance(o, ContextOverflow):
            raise o
    return [None if isinstance(o, BaseException) else clean_insight(o[0][0].text) for o in outs]


class InsightEnv:
    """The task's env, with insights in and out (see the module docstring)."""

    def __init__(
        self,
        env: TaskEnv,
        memory: InsightMemory,
        tokenizer: Any,
        unconditioned_share: float = 0.5,
        per_group: int = 1,
        write_params: SampleParams | None = None,
        seed: int = 0,
        log_path: Path | None = None,
    ):
        self.env, self.task, self.memory, self.tok = env, env.task, memory, tokenizer
        self.unconditioned_share, self.per_group = unconditioned_share, per_group
        self.write_params = write_params or SampleParams(max_tokens=48, temperature=0.7, stop=["\n"])
        self.rng = random.Random(seed)
        self._sampler: Sampler | None = None
        # RUN_DIR/insights.jsonl: every insight written and every conditioned rollout that passed, appended as they
        # happen (a crash loses nothing); `posttrain sft --from-insights` trains on it (SFTL;DR).
        self.log_path = log_path
        # Conditioned rows stay alive for the run: envs cache rendered prompts by row identity.
        self._rows: dict[tuple[str, tuple[str, ...]], dict[str, Any]] = {}

    async def rollout(self, row: dict[str, Any], sampler: Any, params: SampleParams | None = None) -> Trajectory:
        self._sampler = sampler
        key = row_key(row)
        insights = self.memory.get(key)
        conditioned = bool(insights) and self.rng.random() >= self.unconditioned_share
        use = row
        if conditioned:
            use = self._rows.setdefault((key, tuple(insights)), condition_row(row, insights))
        t = await self.env.rollout(use, sampler, params)
        hint = t.guidance.teacher_hint
        if insights and not conditioned:  # internalisation: the teacher reads what the conditioned rollouts read
            hint = insight_block(insights)
        return replace(
            t,
            extra={**t.extra, "insight_key": key, "base_row": row, "insights": insights if conditioned else []},
            metrics={
                **t.metrics,
                "insights/conditioned": float(conditioned),
                "insights/available": float(bool(insights)),
            },
            guidance=replace(t.guidance, teacher_hint=hint),
        )

    async def score(self, trajectories: list[Trajectory]) -> list[Score]:
        """The wrapped env's scores, as NotedScores: the task's feedback (asked here once, for the writer, and
        handed on so score_groups does not ask again) and, for each writer, `insights/written` and the insight."""
        scores = await self.env.score(trajectories)
        now = attach_feedback(self.task, [scored(t, s) for t, s in zip(trajectories, scores, strict=True)])
        by_key: dict[str, list[int]] = {}
        for i, t in enumerate(now):
            if not t.passed and not t.failed and "insight_key" in t.extra:
                by_key.setdefault(t.extra["insight_key"], []).append(i)
        sampler = self._sampler  # the one the last rollout used (None: no rollout yet, nothing to write)
        writers = [i for ix in by_key.values() for i in ix[: self.per_group]] if sampler is not None else []
        texts = (
            await write_insights(sampler, self.tok, [now[i] for i in writers], self.write_params)
            if sampler is not None and writers
            else []
        )
        notes: list[dict[str, Any]] = [{"metrics": {}, "extra": {}} for _ in now]
        records = []
        for i, text in zip(writers, texts, strict=True):
            t = now[i]
            notes[i]["metrics"]["insights/written"] = float(text is not None)
            if text:
                self.memory.add(t.extra["insight_key"], text, t.extra["base_row"].get("prompt"))
                notes[i]["extra"]["insight_written"] = text
                records.append(
                    {
                        "kind": "insight",
                        "key": t.extra["insight_key"],
                        "prompt": t.extra["base_row"].get("prompt"),
                        "insight": text,
                        "attempt": t.completion_text,
                        "feedback": t.feedback,
                    }
                )
        records += [
            {
                "kind": "success",
                "key": t.extra["insight_key"],
                "prompt": t.extra["base_row"].get("prompt"),
                "insights": t.extra["insights"],
                "completion": t.completion_text,
            }
            for t in now
            if t.passed and t.extra.get("insights")
        ]
        self._log(records)
        return [_noted(s, t, fed, **n) for s, t, fed, n in zip(scores, trajectories, now, notes, strict=True)]

    def _log(self, records: list[dict[str, Any]]) -> None:
        if not records or self.log_path is None:
            return
        try:
            with open(self.log_path, "a") as f:
                f.writelines(json.dumps(r, default=str) + "\n" for r in records)
        except OSError:  # the memory still has them; a full disk must not stop training
            pass


def _noted(s: Score, given: Trajectory, fed: Trajectory, metrics: dict[str, float], extra: dict[str, Any]) -> Score:
    """`s` with what scoring learned beyond it: the feedback attach_feedback gave `fed` (or its failure metric),
    and the writer's metrics and extra. A score with nothing to add is returned as it is."""
    feedback = fed.feedback if fed.feedback != given.feedback else None
    metrics = {**{k: v for k, v in fed.metrics.items() if k not in given.metrics}, **metrics}
    if feedback is None and not metrics and not extra:
        return s
    if isinstance(s, NotedScore):  # a wrapped env's own notes come along
        return replace(s, feedback=s.feedback or feedback, metrics={**s.metrics, **metrics}, extra={**s.extra, **extra})
    return NotedScore(s.reward, dict(s.components), s.passed, s.failed, s.error, feedback, metrics, extra)


async def evaluate_with_insights(
    env: TaskEnv,
    sampler: Sampler,
    tokenizer: Any,
    first: list[Trajectory],
    params: SampleParams,
    write_params: SampleParams,
) -> dict[str, float]:
    """Pass@1 with insights in context on the held-out rows: every failed first attempt (`first`, already scored)
    writes an insight and is tried again with it; passes of the first attempt count as passes."""
    from posttrain.envs.base import safe_rollout, score_groups

    # the writer reads each attempt's base row: new records, the eval's own are left as they are
    failed = [replace(t, extra={"base_row": t.row, **t.extra}) for t in first if not t.passed and not t.failed]
    texts = await write_insights(sampler, tokenizer, failed, write_params)
    retry_rows = [condition_row(t.row, [x]) for t, x in zip(failed, texts, strict=True) if x]
    retries = list(await asyncio.gather(*(safe_rollout(env, r, sampler, params) for r in retry_rows)))
    if retries:
        retries = [r for (r,) in await score_groups(env, [[r] for r in retries])]
    passed = sum(t.passed for t in first) + sum(r.passed for r in retries)
    return {
        "eval/insights/pass_rate": passed / max(len(first), 1),
        "eval/insights/retry_pass_rate": sum(r.passed for r in retries) / max(len(retries), 1),
        "eval/insights/written": float(len(retry_rows)),
    }
