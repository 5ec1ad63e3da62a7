"""Preflight verdicts: turn what a preflight measured into diagnoses a new user can act on.

A table of numbers (baseline pass rate 0.000, zero-variance groups 0.50) does not tell a user that their run
will not learn; a verdict does, and says what to change. Everything here is pure: measurements in, verdicts
out, no model and no torch, so the loop can call it with the numbers it already has at training start.

    PreflightMeasurements   what was measured (check.preflight fills it; the loop can fill it from step 1)
    diagnose(m) -> list[Verdict]          ordered worst first; one "ok" verdict when nothing is wrong
    format_verdicts(verdicts) -> str      plain text lines, for the console and logs
    estimate_run_seconds(step_s, steps, eval_s, evals) -> float
    measurements_from_metrics(before, step, ...) -> PreflightMeasurements   from a run's own logged metrics
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

Severity = Literal["stop", "warn", "info", "ok"]
_ORDER = {"stop": 0, "warn": 1, "info": 2, "ok": 3}

# Thresholds, with the reason for each.
NO_SIGNAL_ZERO_VAR = 0.5  # GRPO learns only from groups whose rewards differ; at half or more, most steps are empty
SATURATED_PASS = 0.9  # a headline passed this often leaves little to learn and few groups with any spread
TRUNCATED_FRAC = 0.3  # one completion in three cut at max_tokens: the reward sees unfinished answers


@dataclass(frozen=True)
class PreflightMeasurements:
    """What one preflight measured for one model x task. Fields left None were not measured."""

    baseline_pass_rate: float  # greedy held-out-style pass rate of the untrained model (the task's headline)
    zero_variance_frac: float  # share of sampled groups whose G rewards are all equal: no GRPO signal
    sampled_pass_rate: float | None = None  # pass rate of the sampled (training-temperature) completions
    sampled_reward_mean: float | None = None
    sampled_reward_max: float | None = None  # the best reward any sample got
    truncated_frac: float | None = None  # sampled completions cut at max_tokens
    max_tokens: int | None = None
    reward_errors: int = 0  # samples whose reward function raised (kept out of training)
    samples: int = 0  # sampled completions scored
    first_error: str | None = None
    multi_turn: bool = False  # tool use: the chat template must render turns append-only
    chat_template_ok: bool | None = None  # None: not checked
    chat_template_detail: str = ""
    chat_prompts_without_template: bool = False  # chat-message prompts, but the tokenizer has no chat template
    step_seconds: float | None = None  # one probe step (sample + score + forward/backward + optimizer) here
    steps: int | None = None  # the planned run's loop.steps
    time_budget_s: float | None = None  # the planned run's loop.time_budget_s
    eval_seconds: float | None = None  # one held-out evaluation here
    num_generations: int | None = None  # G
    peak_rss_mb: float | None = None  # this process's peak memory after the probe step
    mem_available_mb: float | None = None  # what the machine (or cgroup) can still give


@dataclass(frozen=True)
class Verdict:
    kind: str  # a stable id tests and tools can match: no_signal, saturated, truncation, ...
    severity: Severity
    message: str  # what is wrong, with the numbers that say so
    advice: list[str] = field(default_factory=list)  # what to change, as concrete settings where there are some


LONG_RUN_S = 15 * 60  # a run estimated longer than this gets advice on bounding it


def estimate_run_seconds(step_s: float, steps: int, eval_s: float = 0.0, evals: int = 2) -> float:
    """Training time of a run: steps x one probe step, plus the held-out evaluations (before and after)."""
    return step_s * steps + eval_s * evals


def measurements_from_metrics(
    before: dict[str, float],
    step: dict[str, float],
    steps: int,
    num_generations: int,
    max_tokens: int | None = None,
    multi_turn: bool = False,
    chat_template_ok: bool | None = None,
    time_budget_s: float | None = None,
) -> PreflightMeasurements:
    """Measurements from what a training run already logs: `before` is the eval before training (keys
    `eval/pass_rate`, `eval/seconds`), `step` the first train step's metrics (`groups/zero_variance_frac`,
    `pass_rate`, `reward/mean`, `completion/truncated_frac`, `rollouts/failed`, `rollouts/count`, `time/step`,
    `perf/peak_rss_mb`, `perf/mem_available_mb`).
    So training start gets the same verdicts as `env check --preflight` without sampling anything twice."""
    return PreflightMeasurements(
        baseline_pass_rate=float(before.get("eval/pass_rate", step.get("pass_rate", 0.0))),
        zero_variance_frac=float(step.get("groups/zero_variance_frac", 0.0)),
        sampled_pass_rate=step.get("pass_rate"),
        sampled_reward_mean=step.get("reward/mean"),
        truncated_frac=step.get("completion/truncated_frac"),
        max_tokens=max_tokens,
        reward_errors=int(step.get("rollouts/failed", 0)),
        samples=int(step.get("rollouts/count", 0)),
        multi_turn=multi_turn,
        chat_template_ok=chat_template_ok,
        step_seconds=step.get("time/step"),
        steps=steps,
        eval_seconds=before.get("eval/seconds"),
        num_generations=num_generations,
        time_budget_s=time_budget_s,
        peak_rss_mb=step.get("perf/peak_rss_mb"),
        mem_available_mb=step.get("perf/mem_available_mb"),
    )


def _signal(m: PreflightMeasurements) -> list[Verdict]:
    zv, base = m.zero_variance_frac, m.baseline_pass_rate
    sampled = m.sampled_pass_rate
    never = base == 0.0 and (sampled is None or sampled == 0.0)
    if never and zv >= NO_SIGNAL_ZERO_VAR:
        g = f"G={m.num_generations}" if m.num_generations else "G"
        return [
            Verdict(
                "no_signal",
                "stop",
                f"no learning signal: the headline reward never passed (baseline pass rate {base:.3f}"
                + (f", sampled {sampled:.3f}" if sampled is not None else "")
                + f") and {zv:.0%} of sampled groups ({g}) have all-equal rewards, so most steps have nothing to "
                "learn from",
                [
                    "add partial credit: a second reward function that a near-miss earns (right answer in the wrong "
                    "format, a valid format with a wrong answer); a reward that never fires teaches nothing",
                    "a warm start: give the task a `demonstrate(row)` hook and set warm_start.steps=20",
                    "a larger G (algorithm.num_generations=8) so rare successes show up in a group",
                    "dynamic sampling (algorithm.dynamic_sampling=true) to replace groups without signal",
                ],
            )
        ]
    if zv >= NO_SIGNAL_ZERO_VAR and not _saturated(m):
        return [
            Verdict(
                "weak_signal",
                "warn",
                f"weak signal: {zv:.0%} of sampled groups have all-equal rewards (baseline pass rate {base:.3f})",
                [
                    "dynamic sampling (algorithm.dynamic_sampling=true) refills those groups with fresh prompts",
                    "a larger G (algorithm.num_generations=8), or partial credit that separates the samples",
                ],
            )
        ]
    return []


def _saturated(m: PreflightMeasurements) -> bool:
    top = m.sampled_pass_rate if m.sampled_pass_rate is not None else m.baseline_pass_rate
    return m.baseline_pass_rate >= SATURATED_PASS and top >= SATURATED_PASS


def _saturation(m: PreflightMeasurements) -> list[Verdict]:
    if not _saturated(m):
        return []
    return [
        Verdict(
            "saturated",
            "warn",
            f"rewards saturated at the top: the model already passes {m.baseline_pass_rate:.0%} greedy"
            + (f" and {m.sampled_pass_rate:.0%} sampled" if m.sampled_pass_rate is not None else "")
            + f", {m.zero_variance_frac:.0%} of groups have all-equal rewards; there is little left to learn",
            [
                "harder prompts, or a stricter headline reward (the first reward function is the pass)",
                "check the reward is not passing wrong answers: add a known-bad smoke check (posttrain env check)",
            ],
        )
    ]


def _truncation(m: PreflightMeasurements) -> list[Verdict]:
    if m.truncated_frac is None or m.truncated_frac < TRUNCATED_FRAC:
        return []
    mt = f" (max_tokens={m.max_tokens})" if m.max_tokens else ""
    raise_to = f"sampling.max_tokens={2 * m.max_tokens}" if m.max_tokens else "sampling.max_tokens"
    return [
        Verdict(
            "truncation",
            "warn",
            f"{m.truncated_frac:.0%} of sampled completions hit the token limit{mt}: rewards score cut-off answers",
            [
                f"raise max_tokens ({raise_to}, or the task's `max_tokens`)",
                "or add stop strings where the answer ends (the task's `stop`, or sampling.stop=[...])",
            ],
        )
    ]


def _reward_errors(m: PreflightMeasurements) -> list[Verdict]:
    if m.reward_errors <= 0:
        return []
    of = f" of {m.samples}" if m.samples else ""
    sev: Severity = "stop" if m.samples and m.reward_errors >= m.samples else "warn"
    return [
        Verdict(
            "reward_error",
            sev,
            f"the reward function raised on {m.reward_errors}{of} samples; those are kept out of training"
            + (f": {m.first_error}" if m.first_error else ""),
            [
                "fix the reward function for outputs like these (empty replies, no number, unexpected types); "
                "return 0.0 or None for an answer it cannot score instead of raising"
            ],
        )
    ]


def _chat_template(m: PreflightMeasurements) -> list[Verdict]:
    out = []
    if m.chat_prompts_without_template:
        out.append(
            Verdict(
                "chat_template",
                "stop",
                "the prompts are chat messages but the tokenizer has no chat template",
                ["use an instruct/chat model, or give the rows plain-text prompts (a string `prompt`)"],
            )
        )
    if m.multi_turn and m.chat_template_ok is False:
        out.append(
            Verdict(
                "chat_template",
                "stop",
                f"chat-template mismatch: multi-turn training needs each turn to extend the last token for token; "
                f"{m.chat_template_detail}",
                [
                    "use a model whose template renders turns append-only (Qwen, SmolLM2, Llama 3 instruct)",
                    "or a single-turn task (no `tools`)",
                ],
            )
        )
    return out


def _timing(m: PreflightMeasurements) -> list[Verdict]:
    if m.step_seconds is None:
        return []
    msg = f"about {m.step_seconds:.1f} s per training step on this machine (one probe step)"
    advice = []
    if m.steps:
        steps = m.steps
        if m.time_budget_s:  # the run stops after the step that spends the budget
            steps = min(steps, math.ceil(m.time_budget_s / m.step_seconds))
        total = estimate_run_seconds(m.step_seconds, steps, m.eval_seconds or 0.0)
        evals = " and 2 held-out evals" if m.eval_seconds else ""
        capped = (
            f" (loop.time_budget_s={m.time_budget_s:g} stops it after about {steps} of {m.steps})"
            if steps < m.steps
            else ""
        )
        msg += f": {steps} steps{evals} take about {total / 60:.1f} min{capped}"
        if total > LONG_RUN_S and not m.time_budget_s:  # a budget the user set is their choice: no advice
            # Machines sold as the same 2-core VM differed 3x in step time (docs/results/vs-trl.md): say how to
            # bound a run that will take much longer than its author planned, before it has taken the time.
            left = LONG_RUN_S - 2 * (m.eval_seconds or 0.0)
            if left >= 2 * m.step_seconds:
                budget = int(left) // 60 * 60
                advice = [
                    f"to bound it: loop.time_budget_s={budget} (training stops after the step that spends "
                    f"it, about {math.ceil(budget / m.step_seconds)} steps here; then it saves and evaluates)"
                ]
            elif m.eval_seconds is not None:
                # the evals alone use up the time: a budget would leave a step or none (a coding-agent run). No eval
                # measured means one step alone takes over half of LONG_RUN_S: only the advice below fits
                advice = [
                    f"the 2 held-out evals alone take about {2 * m.eval_seconds / 60:.0f} min: fewer held-out "
                    "prompts (loop.eval_prompts=N) or shorter episodes bound it, or a loop.time_budget_s "
                    "for the training part"
                ]
            advice.append("or fewer steps: loop.steps=N")
    return [Verdict("time", "info", msg, advice)]


def _memory(m: PreflightMeasurements) -> list[Verdict]:
    # Said once at the start, so a user planning a second job on the machine knows what this one takes; the
    # memory_pressure diagnostic (obs/diagnostic_checks.py) warns if it runs short later.
    if m.peak_rss_mb is None:
        return []
    free = f"; {m.mem_available_mb / 1024:.1f} GB still available" if m.mem_available_mb is not None else ""
    return [Verdict("memory", "info", f"peak memory after one step: {m.peak_rss_mb / 1024:.1f} GB{free}", [])]


def diagnose(m: PreflightMeasurements) -> list[Verdict]:
    """Every verdict the measurements support, worst first. Nothing wrong: one "ok" verdict (plus timing)."""
    found = _signal(m) + _saturation(m) + _truncation(m) + _reward_errors(m) + _chat_template(m)
    if not found:
        found = [
            Verdict(
                "ok",
                "ok",
                f"learning signal present: baseline pass rate {m.baseline_pass_rate:.3f}, "
                f"{m.zero_variance_frac:.0%} of groups without signal",
            )
        ]
    return sorted(found, key=lambda v: _ORDER[v.severity]) + _timing(m) + _memory(m)  # diagnosis first


def format_verdicts(verdicts: list[Verdict], title: str = "preflight verdicts") -> str:
    """Plain text: one line per verdict, its advice indented under it."""
    lines = [f"{title}:"]
    for v in verdicts:
        lines.append(f"  [{v.severity.upper()}] {v.message}")
        lines.extend(f"      - {a}" for a in v.advice)
    return "\n".join(lines)


def worst(verdicts: list[Verdict]) -> Severity:
    """ "stop" or "warn" when any verdict is; otherwise "ok" (an "info" verdict, the time estimate, is no problem)."""
    bad: list[Severity] = [v.severity for v in verdicts if v.severity in ("stop", "warn")]
    return min(bad, key=lambda s: _ORDER[s]) if bad else "ok"
