"""The registered diagnostics: each a pure function of the run's history and the `diagnostics.*` thresholds that
returns a `Finding` while its condition holds, else None. Registered by name with `@diagnostic` (obs/diagnostics.py
holds the registry and the state machine that turns findings into start/clear events); adding one is a function
here and a case in tests/obs/test_diagnostics.py."""

from __future__ import annotations

import math
import statistics

from posttrain.config.schema import DiagnosticsConfig
from posttrain.obs.diagnostic_registry import Finding, History, diagnostic, metric_float

BASELINE_STEPS = 3  # "its first steps' mean": entropy and length are compared to the mean of the first 3 steps


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
        fix = (
            "check that a right answer scores (posttrain env check), and that the model can produce one "
            "(posttrain eval --samples 8 --temperature 1.0); give partial credit; "
        )
    else:
        why = f"the samples of a prompt all score the same (reward {reward:.2f}, pass rate {pass_rate:.0%})"
        fix = "add finer partial credit or a format hint to the prompt; "
    return Finding(
        f"no learning signal: {statistics.fmean(z):.0%} of groups had equal rewards over {cfg.patience} steps; {why}",
        fix + "raise sampling.temperature or algorithm.num_generations so groups differ; "
        "algorithm.dynamic_sampling=true replaces equal groups; diagnostics.remedies.enabled=true raises exploration "
        "for you",
        {"zero_variance_frac": statistics.fmean(z), "reward_mean": reward, "pass_rate": pass_rate},
    )


@diagnostic("saturated")
def saturated(h: History, cfg: DiagnosticsConfig) -> Finding | None:
    """Nearly every training sample passes: the reward is at its maximum and there is little left to learn."""
    p = h.last("pass_rate", cfg.patience)
    if not p or min(p) < cfg.saturated_pass_rate:
        return None
    return Finding(
        f"reward saturated: {p[-1]:.0%} of training samples pass for {cfg.patience} steps",
        "training on these prompts teaches little more: stop here (check the held-out table), "
        "or train on harder prompts",
        {"pass_rate": p[-1]},
    )


@diagnostic("plateau_no_pass")
def plateau_no_pass(h: History, cfg: DiagnosticsConfig) -> Finding | None:
    """The reward stopped rising and the headline pass has not fired in the last 2 windows (or ever, in a shorter
    run): the policy collects partial credit only. Not "never in the run": one lucky early sample that passed
    and was never reproduced should not hide the stall."""
    w = cfg.plateau_window
    r = h.last("reward/mean", w)
    passes = h.series("pass_rate")[-2 * w :]
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
        {"reward_mean": r[-1], "gain": gain, "steps_without_pass": float(len(passes))},
    )


def _baseline(s: list[float]) -> float:
    return statistics.fmean(s[:BASELINE_STEPS])


def _sustained_rise(s: list[float], factor: float, patience: int, min_base: float) -> tuple[float, float] | None:
    """(baseline, latest) when every one of the last `patience` values is at least `factor` x the first steps' mean
    (a baseline of at least `min_base`); None otherwise, or with too few steps to tell."""
    if len(s) < BASELINE_STEPS + patience:
        return None
    base, last = _baseline(s), s[-patience:]
    if base < min_base or min(last) < factor * base:
        return None
    return base, last[-1]


@diagnostic("entropy_collapse")
def entropy_collapse(h: History, cfg: DiagnosticsConfig) -> Finding | None:
    """Per-token entropy fell to (almost) nothing and the samples stopped differing: the policy has stopped
    exploring. Low entropy alone is not reported: a task with one right format (JSON) is learned by making most
    tokens near-certain, and a healthy run's entropy falls 10x while its groups still differ."""
    e = h.series("train/entropy")
    z = h.last("groups/zero_variance_frac", cfg.patience)
    if len(e) < BASELINE_STEPS + cfg.patience or not z:
        return None
    base, last = _baseline(e), e[-cfg.patience :]
    limit = max(cfg.entropy_floor, cfg.entropy_drop_frac * base)
    if max(last) >= limit or statistics.fmean(z) < 0.5:
        return None
    return Finding(
        f"entropy collapse: {last[-1]:.3f} nats per token, from {base:.3f} in the first steps, and "
        f"{statistics.fmean(z):.0%} of groups without reward variance",
        "the policy has stopped exploring: lower trainer.lr, raise sampling.temperature, or use "
        "clip-higher (algorithm.epsilon_high=0.28); diagnostics.remedies.entropy=bonus|lr acts on it",
        {"entropy": last[-1], "entropy_start": base},
    )


@diagnostic("entropy_blowup")
def entropy_blowup(h: History, cfg: DiagnosticsConfig) -> Finding | None:
    """Entropy shot up: the updates are too large and the policy is turning to noise (a learning rate too high)."""
    rise = _sustained_rise(h.series("train/entropy"), cfg.entropy_rise_factor, cfg.patience, min_base=1e-9)
    if rise is None:
        return None
    base, now = rise
    return Finding(
        f"policy blow-up: entropy {now:.2f} nats per token, {now / base:.1f}x its start",
        "the updates are too large: lower trainer.lr (e.g. 4x), keep trainer.max_grad_norm at 1, and "
        "restart from a checkpoint before this step",
        {"entropy": now, "entropy_start": base},
    )


@diagnostic("truncation")
def truncation(h: History, cfg: DiagnosticsConfig) -> Finding | None:
    """Most completions hit the token limit: their endings (often the answer) are never seen by the reward."""
    t = h.last("completion/truncated_frac", cfg.patience)
    if not t or min(t) < cfg.truncated_frac:
        return None
    lmax = h.series("completion/len_max")
    return Finding(
        f"truncation: {t[-1]:.0%} of completions were cut at the token limit for {cfg.patience} steps",
        f"raise sampling.max_tokens (now ~{lmax[-1]:.0f}), add stop strings (sampling.stop), or teach "
        "brevity: algorithm.overlong_buffer_frac=0.2 (soft penalty) or algorithm.overlong_filter=true"
        if lmax
        else "raise sampling.max_tokens or add stop strings (sampling.stop)",
        {"truncated_frac": t[-1]},
    )


@diagnostic("length_runaway")
def length_runaway(h: History, cfg: DiagnosticsConfig) -> Finding | None:
    """Completions keep getting longer: often a reward that pays for length, or a missing stop."""
    rise = _sustained_rise(h.series("completion/len_mean"), cfg.length_growth, cfg.patience, min_base=1.0)
    if rise is None:
        return None
    base, now = rise
    return Finding(
        f"runaway length: completions average {now:.0f} tokens, {now / base:.1f}x the {base:.0f} of the first steps",
        "check the reward does not pay for length (samples.jsonl); add stop strings (sampling.stop) or "
        "a soft overlong penalty (algorithm.overlong_buffer_frac=0.2)",
        {"len_mean": now, "len_start": base},
    )


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
    what = (
        (f"sampler-vs-trainer KL {kl[0]:.3g} per token" if too_far else "")
        + (" and " if too_far and spiked else "")
        + (f"importance ratio {ratio[0]:.3g}" if spiked else "")
    )
    return Finding(
        f"off-policy spike: {what}",
        "check the weight sync and that sampler and trainer use the same dtype and temperature; lower "
        "loop.max_staleness; algorithm.is_correction=truncate bounds the ratio",
        {"sampler_kl_k3": kl[0] if kl else math.nan, "is_ratio_max": ratio[0] if ratio else math.nan},
    )


@diagnostic("skipped_steps")
def skipped_steps(h: History, cfg: DiagnosticsConfig) -> Finding | None:
    """The optimizer step was skipped: the loss or the gradient norm was not finite."""
    s = h.last("train/skipped_step", 1)
    if not s or not s[0] > 0:
        return None
    total = h.series("train/skipped_steps_total")
    n = total[-1] if total else float(sum(x > 0 for x in h.series("train/skipped_step")))
    return Finding(
        f"skipped step: a non-finite loss or gradient norm ({n:.0f} skipped so far)",
        "lower trainer.lr, train in float32 (model.dtype=float32), and check the rewards for nan/inf",
        {"skipped_steps_total": n},
    )


@diagnostic("failing_samples")
def failing_samples(h: History, cfg: DiagnosticsConfig) -> Finding | None:
    """Most samples failed (a rollout or a reward raised, isolated to its sample): the run goes on, but trains on
    what is left, and a step where all failed trains on nothing."""
    failed, count = h.last("rollouts/failed", cfg.patience), h.last("rollouts/count", cfg.patience)
    if not failed or not count or sum(count) <= 0:
        return None
    share = sum(failed) / sum(count)
    if share < cfg.failed_frac:
        return None
    return Finding(
        f"failing samples: {share:.0%} of samples failed over {cfg.patience} steps (kept out of training)",
        "read the errors: the console names the first one of a step, samples.jsonl each sample's "
        "`error`; a reward or env that raises on what the model writes is a bug to fix there (bound "
        "its parsing: posttrain/bounded.py); debug.rollout_fault_rate above 0 fails samples on purpose",
        {"failed_frac": share},
    )


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
    return Finding(
        f"memory pressure: this run peaks at {peak[0] / 1024:.1f} GB and only {max(headroom, 0) / 1024:.1f}"
        " GB is left on the machine; past it the kernel kills the run without a message",
        "run fewer jobs at once; set trainer.gradient_checkpointing=true (layers re-run in backward "
        "instead of keeping their activations) and trainer.logits_chunk_tokens=256; lower "
        "trainer.micro_batch_tokens (activations grow with it); sample fewer completions per step "
        "(algorithm.num_generations, loop.prompts_per_step); or train LoRA (lora.enabled=true: no optimizer state for "
        "the full weights)",
        {"peak_rss_mb": peak[0], "headroom_mb": headroom, "growth_mb": growth},
    )


@diagnostic("heldout_divergence", on="eval")
def heldout_divergence(h: History, cfg: DiagnosticsConfig) -> Finding | None:
    """Held-out pass rate falls while the train reward rises: over-fitting, or the policy found a reward hack."""
    evals = [(int(e["step"]), metric_float(e["eval/pass_rate"])) for e in h.evals if "eval/pass_rate" in e]
    if len(evals) < 2:
        return None
    best_step, best = max(evals[:-1], key=lambda x: x[1])
    now_step, now = evals[-1]
    if best - now < cfg.heldout_drop:
        return None
    r_best, r_now = _train_reward_near(h, best_step, cfg.patience), _train_reward_near(h, now_step, cfg.patience)
    if not r_now > r_best:  # also False with nan
        return None
    return Finding(
        f"held-out falling while train reward rises: held-out pass {best:.0%} at step {best_step} -> "
        f"{now:.0%}, train reward {r_best:.2f} -> {r_now:.2f}",
        "over-fitting or a reward hack: read the latest samples (samples.jsonl) for answers that score "
        f"without being right, tighten the reward, or keep the checkpoint from step {best_step}",
        {"heldout_best": best, "heldout_now": now, "train_reward_then": r_best, "train_reward_now": r_now},
    )


@diagnostic("task_stalled")
def task_stalled(h: History, cfg: DiagnosticsConfig) -> Finding | None:
    """A mixture (tasks/mixture.py): one task's reward stopped rising and none of its samples passed over the last
    plateau window of steps it was drawn in, while the run as a whole goes on. Names the task(s)."""
    w = cfg.plateau_window
    names = sorted({k[len("task/") :].rsplit("/", 1)[0] for k in h.keys() if k.startswith("task/")})
    stalled = {}
    for n in names:
        r, p = h.last(f"task/{n}/reward", w), h.last(f"task/{n}/pass_rate", w)
        if r and p and max(p) == 0.0 and not any(math.isnan(x) for x in r):
            gain = _slope(r) * (w - 1)
            if gain < cfg.plateau_min_gain:
                stalled[n] = (r[-1], gain)
    if not stalled or len(stalled) == len(names):  # all of them: `plateau_no_pass` / `no_signal` say it for the run
        return None
    which = ", ".join(f"{n} (reward {r:.2f}, {g:+.3f} over its last {w} steps)" for n, (r, g) in stalled.items())
    return Finding(
        f"task stalled in the mixture: {which}; none of its samples passed",
        "the other tasks learn, this one does not: check its rewards alone (posttrain env check --task), "
        "give it partial credit or a format hint, raise its weight, or train it on its own first",
        {"tasks_stalled": float(len(stalled))},
    )


def _train_reward_near(h: History, step: int, n: int) -> float:
    """Mean train reward over the n steps up to `step` (the first n steps for step 0, the eval before training)."""
    recs = [t for t in h.train if "reward/mean" in t]
    near = [t for t in recs if step - n < t["step"] <= step] or (recs[:n] if step == 0 else [])
    return statistics.fmean(metric_float(t["reward/mean"]) for t in near) if near else math.nan


def _slope(y: list[float]) -> float:
    """Least-squares slope of y against 0..n-1."""
    n = len(y)
    mx, my = (n - 1) / 2, statistics.fmean(y)
    return sum((i - mx) * (v - my) for i, v in enumerate(y)) / sum((i - mx) ** 2 for i in range(n))
