"""Diagnostics: notice when a run stops learning, say why, and say what to do.

A `Diagnostics` object is fed the records the loop writes to metrics.jsonl (`"kind": "train"` each step,
`"kind": "eval"` each held-out evaluation) and returns the `DiagnosticEvent`s that this record started or
cleared. Each diagnostic is a pure function of the history and the thresholds (`diagnostics.*` config keys),
registered by name in `DIAGNOSTICS`: adding one is a function and a test, never an elif. The state machine
here only turns "the condition holds now" into events: one `start` when it begins, one `clear` once it has
been gone for `clear_after` steps, so a progress line is printed once, not every step.

`posttrain diagnose RUN_DIR` replays a run's metrics.jsonl through the same object (obs/diagnose_run.py), so a
finished run, a running one and the live loop all give the same verdicts.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from posttrain.config.schema import DiagnosticsConfig

BASELINE_STEPS = 3  # "its first steps' mean": entropy and length are compared to the mean of the first 3 steps


@dataclass(frozen=True)
class Finding:
    """A condition that holds now: what is wrong (with the numbers) and what to do about it."""

    verdict: str
    advice: str
    evidence: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class DiagnosticEvent:
    name: str
    state: Literal["start", "clear"]
    step: int
    verdict: str
    advice: str
    evidence: dict[str, float] = field(default_factory=dict)

    def to_record(self) -> dict[str, Any]:
        """The metrics.jsonl line (`"kind": "diagnostic"`; it carries `step`, so resume truncation keeps it right)."""
        return {"kind": "diagnostic", **asdict(self)}

    def line(self) -> str:
        """The one progress-output line (plus the advice) printed when the event happens."""
        if self.state == "clear":
            return f"diagnostic cleared at step {self.step} [{self.name}]"
        return f"diagnostic at step {self.step} [{self.name}]: {self.verdict}\n    -> {self.advice}"


class History:
    """The train and eval records seen so far, with numeric look-ups that skip records lacking a key.

    Each train metric's values are kept as a list as records arrive, so a check costs O(window), not O(steps):
    replaying a 10,000-step run stays fast."""

    def __init__(self) -> None:
        self.train: list[dict[str, Any]] = []
        self.evals: list[dict[str, Any]] = []
        self._series: dict[str, list[float]] = {}

    def add(self, record: dict[str, Any]) -> None:
        if record.get("kind") == "eval":
            self.evals.append(record)
            return
        self.train.append(record)
        for k, v in record.items():
            if k not in ("kind", "step"):
                self._series.setdefault(k, []).append(_num(v))

    def series(self, key: str) -> list[float]:
        """Every train value of key, in order (non-numbers read as nan). Do not modify the returned list."""
        return self._series.get(key, [])

    def last(self, key: str, n: int) -> list[float]:
        """The last n values of key, or [] when there are fewer than n (a condition needs n steps of evidence)."""
        s = self.series(key)
        return s[-n:] if len(s) >= n else []

    @property
    def step(self) -> int:
        recs = self.train[-1:] + self.evals[-1:]
        return int(max((r.get("step", 0) for r in recs), default=0))


def _num(v: Any) -> float:
    # metrics.jsonl writes non-finite floats as strings ("nan", "inf"): read them back as floats.
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


Check = Callable[[History, DiagnosticsConfig], "Finding | None"]


@dataclass(frozen=True)
class Diagnostic:
    name: str
    check: Check
    on: Literal["train", "eval"]  # which records it is evaluated on


DIAGNOSTICS: dict[str, Diagnostic] = {}


def diagnostic(name: str, on: Literal["train", "eval"] = "train") -> Callable[[Check], Check]:
    def register(fn: Check) -> Check:
        DIAGNOSTICS[name] = Diagnostic(name, fn, on)
        return fn
    return register


# ---- the diagnostics ---------------------------------------------------------------------------------------
# Each reads the history and returns a Finding while its condition holds (for `patience` steps), else None.

@diagnostic("no_signal")
def no_signal(h: History, cfg: DiagnosticsConfig) -> Finding | None:
    """Most groups had G equal rewards: their advantages are 0 and the step trains on (almost) nothing."""
    # The window mean, not every step: with 4 prompts a step the share moves in quarters, and one lucky group
    # in a stalled run should not hide the stall.
    z = h.last("groups/zero_variance_frac", cfg.patience)
    if not z or statistics.fmean(z) < cfg.zero_variance_frac:
        return None
    passes = h.last("pass_rate", cfg.patience)
    if passes and passes[-1] >= cfg.saturated_pass_rate:
        return None  # the equal groups are all passes: that is `saturated`, with other advice
    # At most a share p of the groups can be all-pass when a share p of the samples passed: only the equal groups
    # beyond that are surely stalled. (A run at 94% pass whose groups are equal because they all passed is done,
    # not stalled: the custom-task example, seed 0, stayed "no signal" to its end before this.)
    if passes and statistics.fmean(z) - statistics.fmean(passes) < cfg.zero_variance_frac:
        return None
    reward = h.series("reward/mean")[-1] if h.series("reward/mean") else math.nan
    pass_rate = passes[-1] if passes else math.nan
    if reward == 0.0:
        why = "every sample scored 0: the reward never fires"
        fix = ("check that a right answer scores (posttrain env check), and that the model can produce one "
               "(posttrain eval --samples 8 --temperature 1.0); give partial credit; ")
    else:
        why = f"the samples of a prompt all score the same (reward {reward:.2f}, pass rate {pass_rate:.0%})"
        fix = "add finer partial credit or a format hint to the prompt; "
    return Finding(
        f"no learning signal: {statistics.fmean(z):.0%} of groups had equal rewards over {cfg.patience} steps; {why}",
        fix + "raise sampling.temperature or algorithm.num_generations so groups differ; "
        "algorithm.dynamic_sampling=true replaces equal groups; diagnostics.remedies.enabled=true raises exploration "
        "for you",
        {"zero_variance_frac": statistics.fmean(z), "reward_mean": reward, "pass_rate": pass_rate})


@diagnostic("saturated")
def saturated(h: History, cfg: DiagnosticsConfig) -> Finding | None:
    """Nearly every training sample passes: the reward is at its maximum and there is little left to learn."""
    p = h.last("pass_rate", cfg.patience)
    if not p or min(p) < cfg.saturated_pass_rate:
        return None
    return Finding(f"reward saturated: {p[-1]:.0%} of training samples pass for {cfg.patience} steps",
                   "training on these prompts teaches little more: stop here (check the held-out table), "
                   "or train on harder prompts", {"pass_rate": p[-1]})


@diagnostic("plateau_no_pass")
def plateau_no_pass(h: History, cfg: DiagnosticsConfig) -> Finding | None:
    """The reward stopped rising and the headline pass has not fired in the last 2 windows (or ever, in a shorter
    run): the policy collects partial credit only. Not "never in the run": one lucky early sample that passed
    and was never reproduced should not hide the stall."""
    w = cfg.plateau_window
    r = h.last("reward/mean", w)
    passes = h.series("pass_rate")[-2 * w:]
    if not r or len(passes) < w or max(passes) > 0 or any(math.isnan(x) for x in r):
        return None
    gain = _slope(r) * (w - 1)  # fitted trend over the window, robust to one noisy step
    if gain >= cfg.plateau_min_gain:
        return None
    return Finding(
        f"reward plateau: {r[-1]:.2f}, {gain:+.3f} over the last {w} steps, and the headline pass has not fired "
        f"in the last {len(passes)} steps",
        "the policy collects partial credit and never samples a full answer: check one exists "
        "(posttrain env check) and the model can reach it (posttrain eval --samples 8 --temperature 1.0); add a "
        "format hint to the prompt, or a supervised warm start (warm_start.steps) on demonstrations",
        {"reward_mean": r[-1], "gain": gain, "steps_without_pass": float(len(passes))})


def _baseline(s: list[float]) -> float:
    return statistics.fmean(s[:BASELINE_STEPS])


@diagnostic("entropy_collapse")
def entropy_collapse(h: History, cfg: DiagnosticsConfig) -> Finding | None:
    """Per-token entropy fell to (almost) nothing and the samples stopped differing: the policy has stopped
    exploring. Low entropy alone is not reported: a task with one right format (JSON) is learned by making most
    tokens near-certain, and a healthy run's entropy falls 10x while its groups still differ."""
    e = h.series("train/entropy")
    z = h.last("groups/zero_variance_frac", cfg.patience)
    if len(e) < BASELINE_STEPS + cfg.patience or not z:
        return None
    base, last = _baseline(e), e[-cfg.patience:]
    limit = max(cfg.entropy_floor, cfg.entropy_drop_frac * base)
    if max(last) >= limit or statistics.fmean(z) < 0.5:
        return None
    return Finding(f"entropy collapse: {last[-1]:.3f} nats per token, from {base:.3f} in the first steps, and "
                   f"{statistics.fmean(z):.0%} of groups without reward variance",
                   "the policy has stopped exploring: lower trainer.lr, raise sampling.temperature, or use "
                   "clip-higher (algorithm.epsilon_high=0.28); diagnostics.remedies.entropy=bonus|lr acts on it",
                   {"entropy": last[-1], "entropy_start": base})


@diagnostic("entropy_blowup")
def entropy_blowup(h: History, cfg: DiagnosticsConfig) -> Finding | None:
    """Entropy shot up: the updates are too large and the policy is turning to noise (a learning rate too high)."""
    e = h.series("train/entropy")
    if len(e) < BASELINE_STEPS + cfg.patience:
        return None
    base, last = _baseline(e), e[-cfg.patience:]
    if base <= 0 or min(last) <= cfg.entropy_rise_factor * base:
        return None
    return Finding(f"policy blow-up: entropy {last[-1]:.2f} nats per token, {last[-1] / base:.1f}x its start",
                   "the updates are too large: lower trainer.lr (e.g. 4x), keep trainer.max_grad_norm at 1, and "
                   "restart from a checkpoint before this step", {"entropy": last[-1], "entropy_start": base})


@diagnostic("truncation")
def truncation(h: History, cfg: DiagnosticsConfig) -> Finding | None:
    """Most completions hit the token limit: their endings (often the answer) are never seen by the reward."""
    t = h.last("completion/truncated_frac", cfg.patience)
    if not t or min(t) < cfg.truncated_frac:
        return None
    lmax = h.series("completion/len_max")
    return Finding(f"truncation: {t[-1]:.0%} of completions were cut at the token limit for {cfg.patience} steps",
                   f"raise sampling.max_tokens (now ~{lmax[-1]:.0f}), add stop strings (sampling.stop), or teach "
                   "brevity: algorithm.overlong_buffer_frac=0.2 (soft penalty) or algorithm.overlong_filter=true"
                   if lmax else "raise sampling.max_tokens or add stop strings (sampling.stop)",
                   {"truncated_frac": t[-1]})


@diagnostic("length_runaway")
def length_runaway(h: History, cfg: DiagnosticsConfig) -> Finding | None:
    """Completions keep getting longer: often a reward that pays for length, or a missing stop."""
    lens = h.series("completion/len_mean")
    if len(lens) < BASELINE_STEPS + cfg.patience:
        return None
    base, last = _baseline(lens), lens[-cfg.patience:]
    if base < 1 or min(last) < cfg.length_growth * base:
        return None
    return Finding(f"runaway length: completions average {last[-1]:.0f} tokens, {last[-1] / base:.1f}x the "
                   f"{base:.0f} of the first steps",
                   "check the reward does not pay for length (samples.jsonl); add stop strings (sampling.stop) or "
                   "a soft overlong penalty (algorithm.overlong_buffer_frac=0.2)",
                   {"len_mean": last[-1], "len_start": base})


@diagnostic("off_policy")
def off_policy(h: History, cfg: DiagnosticsConfig) -> Finding | None:
    """The sampler's log-probs drifted from the trainer's for the same tokens (stale weights, a dtype or
    temperature mismatch, a broken weight sync): the gradient is no longer the policy's."""
    kl = h.last("train/sampler_kl_k3", 1)
    ratio = h.last("train/is_ratio_max", 1)
    too_far = bool(kl and kl[0] > cfg.sampler_kl_max)
    spiked = bool(ratio and ratio[0] > cfg.is_ratio_max)
    if not (too_far or spiked):
        return None
    what = (f"sampler-vs-trainer KL {kl[0]:.3g} per token" if too_far else "") + \
           (" and " if too_far and spiked else "") + (f"importance ratio {ratio[0]:.3g}" if spiked else "")
    return Finding(f"off-policy spike: {what}",
                   "check the weight sync and that sampler and trainer use the same dtype and temperature; lower "
                   "loop.max_staleness; algorithm.is_correction=truncate bounds the ratio",
                   {"sampler_kl_k3": kl[0] if kl else math.nan, "is_ratio_max": ratio[0] if ratio else math.nan})


@diagnostic("skipped_steps")
def skipped_steps(h: History, cfg: DiagnosticsConfig) -> Finding | None:
    """The optimizer step was skipped: the loss or the gradient norm was not finite."""
    s = h.last("train/skipped_step", 1)
    if not s or not s[0] > 0:
        return None
    total = h.series("train/skipped_steps_total")
    n = total[-1] if total else float(sum(x > 0 for x in h.series("train/skipped_step")))
    return Finding(f"skipped step: a non-finite loss or gradient norm ({n:.0f} skipped so far)",
                   "lower trainer.lr, train in float32 (model.dtype=float32), and check the rewards for nan/inf",
                   {"skipped_steps_total": n})


@diagnostic("memory_pressure")
def memory_pressure(h: History, cfg: DiagnosticsConfig) -> Finding | None:
    """Little memory is left: the kernel's OOM killer ends a run without a word (the log just stops)."""
    peak, now, avail = (h.last(k, 1) for k in ("perf/peak_rss_mb", "perf/rss_mb", "perf/mem_available_mb"))
    if not peak or not avail or math.isnan(avail[0]):
        return None
    # Memory freed since the peak is counted as available now but will be taken again at the next peak.
    headroom = avail[0] - max(0.0, peak[0] - (now[0] if now else peak[0]))
    peaks = h.last("perf/peak_rss_mb", 2)
    growth = peaks[1] - peaks[0] if peaks else 0.0  # at this pace the next step needs this much more
    if not headroom < max(cfg.memory_headroom_mb, growth):
        return None
    return Finding(f"memory pressure: this run peaks at {peak[0] / 1024:.1f} GB and only {max(headroom, 0) / 1024:.1f}"
                   " GB is left on the machine; past it the kernel kills the run without a message",
                   "run fewer jobs at once; lower trainer.micro_batch_tokens (activations grow with it); set "
                   "trainer.logits_chunk_tokens=1024; sample fewer completions per step (algorithm.num_generations, "
                   "loop.prompts_per_step); or train LoRA (lora.enabled=true: no optimizer state for the full weights)",
                   {"peak_rss_mb": peak[0], "headroom_mb": headroom, "growth_mb": growth})


@diagnostic("heldout_divergence", on="eval")
def heldout_divergence(h: History, cfg: DiagnosticsConfig) -> Finding | None:
    """Held-out pass rate falls while the train reward rises: over-fitting, or the policy found a reward hack."""
    evals = [(int(e["step"]), _num(e["eval/pass_rate"])) for e in h.evals if "eval/pass_rate" in e]
    if len(evals) < 2:
        return None
    best_step, best = max(evals[:-1], key=lambda x: x[1])
    now_step, now = evals[-1]
    if best - now < cfg.heldout_drop:
        return None
    r_best, r_now = _train_reward_near(h, best_step, cfg.patience), _train_reward_near(h, now_step, cfg.patience)
    if not r_now > r_best:  # also False with nan
        return None
    return Finding(f"held-out falling while train reward rises: held-out pass {best:.0%} at step {best_step} -> "
                   f"{now:.0%}, train reward {r_best:.2f} -> {r_now:.2f}",
                   "over-fitting or a reward hack: read the latest samples (samples.jsonl) for answers that score "
                   f"without being right, tighten the reward, or keep the checkpoint from step {best_step}",
                   {"heldout_best": best, "heldout_now": now, "train_reward_then": r_best, "train_reward_now": r_now})


def _train_reward_near(h: History, step: int, n: int) -> float:
    """Mean train reward over the n steps up to `step` (the first n steps for step 0, the eval before training)."""
    recs = [t for t in h.train if "reward/mean" in t]
    near = [t for t in recs if step - n < t["step"] <= step] or (recs[:n] if step == 0 else [])
    return statistics.fmean(_num(t["reward/mean"]) for t in near) if near else math.nan


def _slope(y: list[float]) -> float:
    """Least-squares slope of y against 0..n-1."""
    n = len(y)
    mx, my = (n - 1) / 2, statistics.fmean(y)
    return sum((i - mx) * (v - my) for i, v in enumerate(y)) / sum((i - mx) ** 2 for i in range(n))


# ---- the state machine -------------------------------------------------------------------------------------

class Diagnostics:
    """Feed it every train and eval record, in order; it returns the events each record started or cleared."""

    def __init__(self, cfg: DiagnosticsConfig | None = None, names: list[str] | None = None):
        self.cfg = cfg or DiagnosticsConfig()
        self.diagnostics = [DIAGNOSTICS[n] for n in (names or DIAGNOSTICS)]
        self.history = History()
        self.active: dict[str, DiagnosticEvent] = {}
        self._misses: dict[str, int] = {}
        self.events: list[DiagnosticEvent] = []

    def observe(self, record: dict[str, Any]) -> list[DiagnosticEvent]:
        kind = record.get("kind")
        if kind not in ("train", "eval"):
            return []  # diagnostic, remedy and warm-start records say nothing about learning
        self.history.add(record)
        if not self.cfg.enabled:
            return []
        step = int(record.get("step", 0))
        out = []
        for d in self.diagnostics:
            if d.on != kind:
                continue
            found = d.check(self.history, self.cfg)
            if found is not None:
                self._misses[d.name] = 0
                if d.name not in self.active:
                    ev = DiagnosticEvent(d.name, "start", step, found.verdict, found.advice, found.evidence)
                    self.active[d.name] = ev
                    out.append(ev)
            elif d.name in self.active:
                self._misses[d.name] = self._misses.get(d.name, 0) + 1
                # Eval diagnostics are checked rarely: one good eval clears them.
                if d.on == "eval" or self._misses[d.name] >= self.cfg.clear_after:
                    started = self.active.pop(d.name)
                    out.append(DiagnosticEvent(d.name, "clear", step, f"cleared ({started.verdict})", "", {}))
        self.events += out
        return out

    def replay(self, records: list[dict[str, Any]]) -> list[DiagnosticEvent]:
        """Feed a whole metrics.jsonl (e.g. on resume, or `posttrain diagnose`); returns every event."""
        out = []
        for r in records:
            out += self.observe(r)
        return out

    def summary(self) -> list[dict[str, Any]]:
        """One entry per episode of each diagnostic (for summary.json and the final table): when it started,
        when it cleared (None: still active at the end), the verdict and the advice."""
        out: list[dict[str, Any]] = []
        open_: dict[str, dict[str, Any]] = {}
        for e in self.events:
            if e.state == "start":
                open_[e.name] = {"name": e.name, "start_step": e.step, "end_step": None, "verdict": e.verdict,
                                 "advice": e.advice, "evidence": e.evidence}
                out.append(open_[e.name])
            elif e.name in open_:
                open_.pop(e.name)["end_step"] = e.step
        return out

    # Resume: the loop can either replay the kept metrics.jsonl (replay) or save/restore this state.
    def state_dict(self) -> dict[str, Any]:
        return {"train": self.history.train, "evals": self.history.evals,
                "active": {k: asdict(v) for k, v in self.active.items()}, "misses": dict(self._misses),
                "events": [asdict(e) for e in self.events]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history = History()
        for r in state["evals"]:
            self.history.add(r)
        for r in state["train"]:
            self.history.add(r)
        self.active = {k: DiagnosticEvent(**v) for k, v in state["active"].items()}
        self._misses = dict(state["misses"])
        self.events = [DiagnosticEvent(**e) for e in state["events"]]
