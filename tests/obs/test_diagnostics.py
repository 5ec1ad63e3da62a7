"""Every diagnostic fires on a metric stream built to trigger it, within 5 steps of the stall starting, and a
healthy stream triggers none. Streams are synthetic train/eval records with the loop's metric names."""

import json
import math
import random

import pytest

from posttrain.config.schema import DiagnosticsConfig
from posttrain.obs.diagnostics import DIAGNOSTICS, DiagnosticEvent, Diagnostics

STALL_AT = 11  # first step of the bad condition in every stall stream


def healthy(step: int, rng: random.Random) -> dict:
    """A run that learns: reward and pass rate rise, a quarter of the groups without variance, steady entropy."""
    p = min(0.9, 0.15 + 0.02 * step)
    return {"kind": "train", "step": step, "reward/mean": 0.4 + 0.9 * p + rng.uniform(-0.05, 0.05),
            "reward/std": 0.3, "pass_rate": p, "groups/zero_variance_frac": rng.choice([0.0, 0.25, 0.25, 0.5]),
            "train/entropy": 0.35 + rng.uniform(-0.05, 0.05), "completion/truncated_frac": rng.choice([0.0, 0.0625]),
            "completion/len_mean": 40 + rng.uniform(-5, 5), "completion/len_max": 64.0,
            "train/sampler_kl_k3": 1e-4, "train/skipped_step": 0.0, "train/skipped_steps_total": 0.0}


def stream(n: int = 30, bad=None, evals=None, seed: int = 0) -> list[dict]:
    """n train records; from STALL_AT on, `bad(record, step)` edits each; eval records from `evals(step)`."""
    rng = random.Random(seed)
    out = []
    for s in range(1, n + 1):
        r = healthy(s, rng)
        if bad and s >= STALL_AT:
            bad(r, s)
        out.append(r)
        if evals and s % 5 == 0:
            out.append({"kind": "eval", "step": s, "eval/pass_rate": evals(s)})
    if evals:
        out.insert(0, {"kind": "eval", "step": 0, "eval/pass_rate": evals(0)})
    return out


def run(records, cfg=None) -> list[DiagnosticEvent]:
    return Diagnostics(cfg).replay(records)


def _no_signal(r, s):  # the stall: every sample earns the same partial credit
    r.update({"groups/zero_variance_frac": 1.0, "reward/mean": 0.3, "reward/std": 0.0})


def _never_fires(r, s):
    r.update({"groups/zero_variance_frac": 1.0, "reward/mean": 0.0, "reward/std": 0.0, "pass_rate": 0.0})


def _saturated(r, s):
    r.update({"pass_rate": 1.0, "groups/zero_variance_frac": 1.0})


def _collapse(r, s):
    r["train/entropy"] = 0.35 * 0.5 ** (s - STALL_AT + 2)


def _blowup(r, s):
    r["train/entropy"] = 2.5


def _truncation(r, s):
    r["completion/truncated_frac"] = 0.8


def _runaway(r, s):
    r["completion/len_mean"] = 40 * 1.3 ** (s - STALL_AT + 2)


def _kl_spike(r, s):
    if s == STALL_AT:
        r["train/sampler_kl_k3"] = 0.4


def _is_spike(r, s):
    if s == STALL_AT:
        r["train/is_ratio_max"] = 55.0


def _skipped(r, s):
    if s == STALL_AT:
        r.update({"train/skipped_step": 1.0, "train/loss": "nan"})
    r["train/skipped_steps_total"] = 1.0


def _plateau_stream() -> list[dict]:
    """Pass never fires; partial credit climbs to 0.3 by step 10, then is flat (with noise, and groups that
    still differ, so this is not `no_signal`)."""
    rng = random.Random(1)
    out = []
    for s in range(1, 31):
        r = healthy(s, rng)
        r.update({"pass_rate": 0.0, "reward/mean": min(0.3, 0.03 * s) + rng.uniform(-0.02, 0.02),
                  "groups/zero_variance_frac": 0.5})
        out.append(r)
    return out


CASES = {
    "no_signal": (stream(bad=_no_signal), STALL_AT),
    "saturated": (stream(bad=_saturated), STALL_AT),
    "plateau_no_pass": (_plateau_stream(), STALL_AT),
    "entropy_collapse": (stream(bad=_collapse), STALL_AT),
    "entropy_blowup": (stream(bad=_blowup), STALL_AT),
    "truncation": (stream(bad=_truncation), STALL_AT),
    "length_runaway": (stream(bad=_runaway), STALL_AT),
    "off_policy": (stream(bad=_kl_spike), STALL_AT),
    "skipped_steps": (stream(bad=_skipped), STALL_AT),
    # held-out: best 40% at step 10, then 25% at step 15 while the train reward keeps climbing
    "heldout_divergence": (stream(evals=lambda s: {0: 0.2, 5: 0.3, 10: 0.4}.get(s, 0.25)), STALL_AT),
}


def test_every_registered_diagnostic_has_a_case():
    assert set(CASES) == set(DIAGNOSTICS)


@pytest.mark.parametrize("name", sorted(CASES))
def test_diagnostic_fires_within_5_steps_of_the_stall(name):
    records, stall = CASES[name]
    starts = [e for e in run(records) if e.state == "start" and e.name == name]
    assert starts, f"{name} never fired"
    assert len(starts) == 1, "a condition that persists is reported once"
    assert stall <= starts[0].step <= stall + 5
    assert starts[0].verdict and starts[0].advice


@pytest.mark.parametrize("seed", range(5))
def test_healthy_run_triggers_nothing(seed):
    records = stream(n=60, seed=seed, evals=lambda s: min(0.9, 0.2 + 0.01 * s))
    assert run(records) == []


def test_stall_reports_the_diagnostic_that_explains_it():
    names = {e.name for e in run(stream(bad=_no_signal))}
    assert "no_signal" in names and "saturated" not in names
    names = {e.name for e in run(stream(bad=_saturated))}
    assert names == {"saturated"}, "zero variance because everything passes is saturation, not a stall"
    ev = next(e for e in run(stream(bad=_never_fires)) if e.name == "no_signal")
    assert "never fires" in ev.verdict
    ev = next(e for e in run(stream(bad=_no_signal)) if e.name == "no_signal")
    assert "never fires" not in ev.verdict and "temperature" in ev.advice


def test_clear_after_the_condition_is_gone_for_clear_after_steps():
    def stall_then_recover(r, s):
        if s < STALL_AT + 8:
            _no_signal(r, s)
    events = [e for e in run(stream(bad=stall_then_recover)) if e.name == "no_signal"]
    assert [e.state for e in events] == ["start", "clear"]
    assert events[1].step == STALL_AT + 8 + DiagnosticsConfig().clear_after - 1


def test_thresholds_are_config_keys():
    records = stream(bad=_truncation)
    assert any(e.name == "truncation" for e in run(records))
    assert not any(e.name == "truncation" for e in run(records, DiagnosticsConfig(truncated_frac=0.9)))
    late = [e for e in run(records, DiagnosticsConfig(patience=5)) if e.name == "truncation"]
    assert late[0].step == STALL_AT + 4
    assert run(records, DiagnosticsConfig(enabled=False)) == []


def test_non_finite_values_from_jsonl_do_not_crash():
    records = stream(bad=_skipped)
    records = [json.loads(json.dumps({k: (str(v) if isinstance(v, float) and not math.isfinite(v) else v)
                                      for k, v in r.items()})) for r in records]
    assert any(e.name == "skipped_steps" for e in run(records))


def test_other_records_are_ignored_and_events_serialize():
    d = Diagnostics()
    assert d.observe({"kind": "diagnostic", "step": 1, "name": "x"}) == []
    ev = [e for e in d.replay(stream(bad=_truncation)) if e.state == "start"][0]
    rec = json.loads(json.dumps(ev.to_record()))
    assert rec["kind"] == "diagnostic" and rec["name"] == "truncation" and rec["step"] == ev.step
    assert "truncation" in ev.line() and "->" in ev.line()


def test_summary_and_state_dict_resume_give_the_same_events():
    records = stream(bad=_no_signal)
    whole = Diagnostics()
    whole.replay(records)
    first = Diagnostics()
    first.replay(records[:12])
    second = Diagnostics()
    second.load_state_dict(json.loads(json.dumps(first.state_dict())))
    second.replay(records[12:])
    assert second.events == whole.events
    summ = whole.summary()
    assert summ[0]["name"] == "no_signal" and summ[0]["end_step"] is None
