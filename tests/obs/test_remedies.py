"""Remedies: each acts while its diagnostic is active, stays within its bounds, is logged, decays back, and
survives a resume. Driven by the same synthetic streams as the diagnostics tests."""

import json

from diag_streams import STALL_AT, _blowup, _collapse, _no_signal, _runaway, _skipped, _truncation, stream

from posttrain.config.schema import DiagnosticsConfig, RemediesConfig
from posttrain.obs.diagnostics import Diagnostics
from posttrain.obs.remedies import Overrides, Remedies, with_format_hint


def drive(records, rcfg: RemediesConfig, base_t=0.7, base_g=4):
    """Run diagnostics + remedies over a stream; returns [(step, overrides)] for the train records."""
    d, rem = Diagnostics(), Remedies(rcfg, base_t, base_g, DiagnosticsConfig())
    out = []
    for r in records:
        ov = rem.update(r["step"], r, d.observe(r))
        if r["kind"] == "train":
            out.append((r["step"], ov))
    return out


ON = RemediesConfig(enabled=True, format_hint_mode="prompt")  # exploration by temperature and G (guide: test_guide_hint)


def test_on_by_default_and_off_changes_nothing():
    assert RemediesConfig().enabled is True  # bench/defaults.py: no case lost by it (README, "Every step teaches")
    assert all(ov == Overrides() for _, ov in drive(stream(bad=_no_signal), RemediesConfig(enabled=False)))
    assert any(ov.changes for _, ov in drive(stream(bad=_no_signal), RemediesConfig()))


def test_healthy_run_gets_no_remedy():
    assert all(ov.neutral and not ov.changes for _, ov in drive(stream(n=60), ON))


def test_no_signal_raises_exploration_within_bounds_then_decays_back():
    def stall_then_recover(r, s):
        if s < STALL_AT + 8:
            _no_signal(r, s)
    steps = drive(stream(n=40, bad=stall_then_recover), ON)
    by = dict(steps)
    assert by[STALL_AT].neutral  # not before the diagnostic fired
    temps = [ov.temperature for _, ov in steps if ov.temperature is not None]
    gs = [ov.num_generations for _, ov in steps if ov.num_generations is not None]
    assert temps and max(temps) <= ON.temperature_max and min(temps) > 0.7
    assert gs and max(gs) == ON.num_generations_max and min(gs) > 4
    peak = max(s for s, ov in steps if ov.temperature == max(temps))
    assert by[peak].format_hint  # after format_hint_after stalled steps
    assert by[40].neutral, "after the groups had variance again, everything decays back to the config"
    changes = [c for _, ov in steps for c in ov.changes]
    assert any(c.remedy == "raise exploration" for c in changes)
    assert any("back to the config" in c.detail for c in changes)
    rec = json.loads(json.dumps(changes[0].to_record()))
    assert rec["kind"] == "remedy" and rec["step"] == changes[0].step and "remedy at step" in changes[0].line()


def test_a_step_with_a_pass_holds_the_boost_until_the_diagnostic_clears():
    def stall_with_a_lucky_pass(r, s):
        _no_signal(r, s)
        if s == STALL_AT + 5:
            r["pass_rate"] = 0.0625  # exploration found a full answer once
    steps = dict(drive(stream(n=30, bad=stall_with_a_lucky_pass), ON))
    assert steps[STALL_AT + 5].temperature == steps[STALL_AT + 4].temperature  # held, not decayed
    assert steps[STALL_AT + 6].temperature > steps[STALL_AT + 5].temperature or \
        steps[STALL_AT + 6].temperature == ON.temperature_max


def test_plateau_without_a_pass_is_a_stall_too():
    from diag_streams import _plateau_stream
    steps = drive(_plateau_stream(), ON)
    assert any(ov.temperature for _, ov in steps)


def test_temperature_rise_follows_each_stalled_step():
    steps = dict(drive(stream(n=20, bad=_no_signal), RemediesConfig(enabled=True, temperature_max=5.0,
                                                                    format_hint_mode="prompt")))
    t1, t2 = steps[STALL_AT + 2].temperature, steps[STALL_AT + 3].temperature
    assert t1 is not None and abs(t2 - t1 - ON.temperature_step) < 1e-9


def test_format_hint_can_be_turned_off():
    steps = drive(stream(bad=_no_signal), RemediesConfig(enabled=True, format_hint=False))
    assert not any(ov.format_hint for _, ov in steps)


def test_entropy_collapse_bonus_or_lower_lr():
    bonus = drive(stream(bad=_collapse), RemediesConfig(enabled=True, entropy="bonus", entropy_bonus=0.02))
    assert bonus[-1][1].entropy_coef == 0.02 and bonus[-1][1].lr_scale == 1.0
    lr = drive(stream(bad=_collapse), RemediesConfig(enabled=True, entropy="lr", lr_scale=0.25))
    assert lr[-1][1].lr_scale == 0.25 and lr[-1][1].entropy_coef == 0.0
    off = drive(stream(bad=_collapse), RemediesConfig(enabled=True, entropy="off"))
    assert off[-1][1].entropy_coef == 0.0 and off[-1][1].lr_scale == 1.0


def test_blowup_and_skipped_step_lower_the_lr_while_active():
    assert drive(stream(bad=_blowup), ON)[-1][1].lr_scale == ON.lr_scale
    steps = dict(drive(stream(bad=_skipped), ON))
    assert steps[STALL_AT].lr_scale == ON.lr_scale and steps[30].lr_scale == 1.0


def test_runaway_length_overlong_penalty_and_stop_strings():
    cfg = RemediesConfig(enabled=True, stop=["\n\n"])
    last = drive(stream(bad=_runaway), cfg)[-1][1]
    assert last.overlong_buffer_frac == 0.2 and last.extra_stop == ("\n\n",)
    trunc = drive(stream(bad=_truncation), cfg)[-1][1]
    assert trunc.extra_stop == ("\n\n",) and trunc.overlong_buffer_frac is None


def test_state_dict_resume_continues_identically():
    records = stream(n=40, bad=_no_signal)
    d, rem = Diagnostics(), Remedies(ON, 0.7, 4)
    whole = [rem.update(r["step"], r, d.observe(r)) for r in records]
    d1, r1 = Diagnostics(), Remedies(ON, 0.7, 4)
    first = [r1.update(r["step"], r, d1.observe(r)) for r in records[:15]]
    d2, r2 = Diagnostics(), Remedies(ON, 0.7, 4)
    d2.load_state_dict(json.loads(json.dumps(d1.state_dict())))
    r2.load_state_dict(json.loads(json.dumps(r1.state_dict())))
    rest = [r2.update(r["step"], r, d2.observe(r)) for r in records[15:]]
    assert first + rest == whole


def test_with_format_hint_changes_only_the_prompt():
    row = {"prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}], "label": "x",
           "format_hint": "One word."}
    hinted = with_format_hint(row)
    assert hinted["prompt"][-1]["content"] == "q\nOne word." and hinted["label"] == "x"
    assert row["prompt"][-1]["content"] == "q", "the original row is not modified"
    assert with_format_hint({"prompt": "q", "format_hint": "h"})["prompt"] == "q\nh"
    plain = {"prompt": "q"}
    assert with_format_hint(plain) is plain
