"""Eval suites: several tasks' held-out prompts at once, k samples per prompt, pass@1 / pass@k / maj@k per task.

    suite = [SuiteTask.load("count-a"), SuiteTask.load("reasoning_gym:leg_counting", {"eval_size": 32})]
    result = run_suite(suite, sampler, tokenizer, SuiteSettings(samples=8, temperature=0.7))
    result.table()          rows of (task, prompts, pass@1, pass@k, maj@k, reward, seconds)
    result.to_json()        the same, with each task's metrics, for a file

`posttrain eval --task A --task B --samples 8` runs one (a base model evaluated without training is the baseline);
a run evaluates its suite every `eval_suite.every` steps (config/eval_suite.py). pass@1 is the mean over the k
samples, pass@k the unbiased estimator, maj@k the majority answer's correctness where answers compare (extracted by
the task's answer format: rewards/extract.py). Every task's rollouts go through the same failure isolation as a
run's eval (loop/evaluate.py): a sample that raises is a failed sample, never a failed suite.
"""

from __future__ import annotations

import asyncio
import difflib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from posttrain.algos.pass_at_k import prompt_metrics, suite_metrics
from posttrain.config.eval_suite import EvalSuiteConfig
from posttrain.config.formats import ANSWER_FORMATS
from posttrain.envs.base import make_env
from posttrain.envs.task import Task
from posttrain.loop.evaluate import EvalSettingsError, check_samples, evaluate_async
from posttrain.rewards.extract import extract_answer
from posttrain.sampling.base import Sampler
from posttrain.types import SampleParams, Trajectory


@dataclass
class SuiteTask:
    """One task of a suite: the task, how many of its held-out prompts, how its answers are read for maj@k."""

    task: Task
    prompts: int = 32
    answer_format: str = "auto"  # one of config/formats.py ANSWER_FORMATS (the config's is typed AnswerFormat)
    max_tokens: int | None = None  # None: the task's own (or 128)

    def __post_init__(self) -> None:
        if self.answer_format not in ANSWER_FORMATS:  # `posttrain eval --answer-format` passes a plain string
            near = difflib.get_close_matches(str(self.answer_format), ANSWER_FORMATS, n=1, cutoff=0.5)
            raise EvalSettingsError(
                f"answer_format {self.answer_format!r} is not one of {', '.join(ANSWER_FORMATS)}"
                + (f" (did you mean {near[0]!r}?)" if near else "")
            )

    @classmethod
    def load(
        cls,
        name: str,
        options: dict[str, Any] | None = None,
        prompts: int = 32,
        answer_format: str = "auto",
        seed: int = 0,
    ) -> SuiteTask:
        from posttrain.tasks.load import load_task

        return cls(load_task(name, options, seed=seed), prompts=prompts, answer_format=answer_format)


@dataclass(frozen=True)
class SuiteSettings:
    samples: int = 8  # k: completions per prompt, 1 to MAX_EVAL_SAMPLES (1024)
    temperature: float = 0.7  # > 0 when samples > 1, or the k samples are one greedy answer k times
    max_tokens: int = 128
    every_s: float = 60.0  # progress lines on long evals

    def __post_init__(self):
        check_samples(self.samples)
        if not 0.0 <= self.temperature < math.inf:  # NaN fails both comparisons
            raise EvalSettingsError(f"the suite's temperature must be a finite number >= 0, got {self.temperature}")


@dataclass
class TaskResult:
    name: str
    prompts: int
    metrics: dict[str, float]  # pass@1, pass@k, maj@k, reward, and the eval's own eval/* metrics
    seconds: float

    def row(self, k: int) -> dict[str, Any]:
        m = self.metrics
        return {
            "task": self.name,
            "prompts": self.prompts,
            "pass@1": m.get("pass@1", 0.0),
            f"pass@{k}": m.get(f"pass@{k}", 0.0),
            f"maj@{k}": m.get(f"maj@{k}"),
            "reward": m.get("reward", 0.0),
            "seconds": round(self.seconds, 1),
        }


@dataclass
class SuiteResult:
    samples: int
    tasks: list[TaskResult] = field(default_factory=list)

    def table(self) -> list[dict[str, Any]]:
        return [t.row(self.samples) for t in self.tasks]

    def flat_metrics(self, prefix: str = "suite/") -> dict[str, float]:
        """One metrics record: `suite/<task>/pass@1`, ... (what a run logs every eval_suite.every steps)."""
        out: dict[str, float] = {}
        for t in self.tasks:
            for key in ("pass@1", f"pass@{self.samples}", f"maj@{self.samples}", "reward"):
                if t.metrics.get(key) is not None:
                    out[f"{prefix}{t.name}/{key}"] = float(t.metrics[key])
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "samples": self.samples,
            "tasks": [
                {"task": t.name, "prompts": t.prompts, "seconds": t.seconds, "metrics": t.metrics} for t in self.tasks
            ],
        }


def score_samples(trajs: list[Trajectory], samples: int, answer_format: str) -> dict[str, float]:
    """pass@1, pass@k, maj@k and the mean reward over prompts whose `samples` trajectories are consecutive."""
    per_prompt = []
    for i in range(0, len(trajs), samples):
        group = trajs[i : i + samples]
        passed = [t.passed and not t.failed for t in group]
        answers = [None if t.failed else extract_answer(t.completion_text, answer_format) for t in group]
        per_prompt.append(prompt_metrics(passed, samples, answers))
    out = suite_metrics(per_prompt)
    ok = [t.reward for t in trajs if not t.failed]
    out["reward"] = sum(ok) / len(ok) if ok else 0.0
    return out


async def run_suite_async(
    tasks: list[SuiteTask],
    sampler: Sampler,
    tokenizer: Any,
    settings: SuiteSettings,
    progress: Callable[[str], None] | None = None,
) -> SuiteResult:
    """Each task in turn (its own env and max_tokens), its prompts' k samples as loop/evaluate.py runs them (at most
    EVAL_CONCURRENCY rollouts at once). `settings` were checked when made (SuiteSettings)."""
    result = SuiteResult(settings.samples)
    for st in tasks:
        t0 = time.perf_counter()
        max_tokens = st.max_tokens or st.task.max_tokens or settings.max_tokens
        params = SampleParams(max_tokens=max_tokens, temperature=settings.temperature, stop=list(st.task.stop))
        env = make_env(st.task, tokenizer, params)
        rows = st.task.eval_rows[: st.prompts]
        if progress:
            progress(f"eval suite: {st.task.name}: {len(rows)} prompts x {settings.samples} samples")
        m, trajs = await evaluate_async(
            env, sampler, rows, params, settings.samples, progress=progress, every_s=settings.every_s
        )
        metrics = {**m, **score_samples(trajs, settings.samples, st.answer_format)}
        result.tasks.append(TaskResult(st.task.name, len(rows), metrics, time.perf_counter() - t0))
    return result


def run_suite(
    tasks: list[SuiteTask],
    sampler: Sampler,
    tokenizer: Any,
    settings: SuiteSettings,
    progress: Callable[[str], None] | None = None,
) -> SuiteResult:
    return asyncio.run(run_suite_async(tasks, sampler, tokenizer, settings, progress))


def suite_tasks(cfg: EvalSuiteConfig, seed: int = 0) -> list[SuiteTask]:
    """The tasks of a config's `eval_suite` section (checked by its models: config/task_options.py), loaded once for
    the run."""
    return [SuiteTask.load(t.name, t.options, t.prompts or cfg.prompts, cfg.answer_format, seed) for t in cfg.tasks]


def with_prompts(tasks: list[SuiteTask], prompts: int) -> list[SuiteTask]:
    return [replace(t, prompts=prompts) for t in tasks]
