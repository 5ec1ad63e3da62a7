"""The search loop with fake trials: crashes and timeouts are failed trials, the noise-aware rule decides what is
kept, a stopped search resumes, Optuna prunes on intermediate evals, and the report is written."""

import json
import sys
from pathlib import Path

import pytest

from auto_helpers import Scripted
from posttrain.auto.runner import Outcome, SubprocessRunner
from posttrain.auto.search import SearchError, read_results, resume_search, start_search

FAKE = Path(__file__).with_name("fake_train.py")


def fake_subprocess_runner(base=None):
    return SubprocessRunner("eval/pass_rate", base, command=[sys.executable, str(FAKE)], poll_s=0.1)


def params_of(spec):
    return {k: json.loads(v) for k, v in (o.split("=", 1) for o in spec.overrides)}


class TableRunner:
    """In-process: the metric is table[(lr, seed)]; records every call."""

    def __init__(self, table, evals=None):
        self.table, self.calls, self.evals = table, [], evals

    def __call__(self, spec, on_eval=None):
        lr = params_of(spec)["trainer.lr"]
        self.calls.append((lr, spec.seed))
        spec.run_dir.mkdir(parents=True)
        return Outcome("ok", self.table[(lr, spec.seed)], spec.run_dir, 0.01)


def test_crash_and_timeout_are_failed_trials_and_the_loop_goes_on(write_program, tmp_path):
    p, b = write_program(search={"task.options.mode": {"choices": ["ok", "crash", "hang"]},
                                 "trainer.lr": {"low": 1e-6, "high": 1e-2, "log": True}},
                         budget={"trial": {"steps": 2, "timeout_s": 1.5}, "total": {"trials": 3}})
    prop = Scripted([{"task.options.mode": "crash", "trainer.lr": 1e-4},
                     {"task.options.mode": "hang", "trainer.lr": 1e-4},
                     {"task.options.mode": "ok", "trainer.lr": 3e-5}])
    res = start_search(p, b, tmp_path / "s", runner=fake_subprocess_runner(b), proposer=prop, log=lambda s: None)
    rows = read_results(tmp_path / "s")
    assert [(r["trial"], r["status"], r["decision"]) for r in rows] == [
        ("0", "ok", "baseline"), ("1", "failed", "failed"), ("2", "timeout", "failed"), ("3", "ok", "kept")]
    assert "exit code 1" in rows[1]["reason"] and "boom (fake trial crashed)" in rows[1]["reason"]
    assert "timed out after 2s" in rows[2]["reason"]
    assert [s for _, _, s in prop.finished] == ["failed", "failed", "complete"]
    # every trial seed is a normal run directory, with its log
    assert (tmp_path / "s/trials/trial-003-s0/summary.json").exists()
    assert (tmp_path / "s/logs/trial-001-s0.log").read_text().count("boom") == 1
    assert res.incumbent["trial"] == 3 and res.incumbent["values"] == pytest.approx([0.9886, 0.9986])
    assert (tmp_path / "s/best.yaml").read_text() == "fake: true\n"


def test_within_noise_is_reverted_and_a_winner_is_confirmed_on_a_second_seed(write_program, tmp_path):
    p, b = write_program(budget={"trial": {"steps": 2}, "total": {"trials": 3}})
    base = 2e-5
    table = {(base, 0): 0.50, (base, 1): 0.60,  # the incumbent: mean 0.55, spread 0.10
             (1e-4, 0): 0.62,                    # +0.07 on seed 0: within noise, no second seed
             (1e-3, 0): 0.80, (1e-3, 1): 0.40,   # looks like a win on seed 0; seed 1 undoes it (mean 0.60)
             (3e-4, 0): 0.80, (3e-4, 1): 0.75}   # a real win: mean 0.775
    runner = TableRunner(table)
    prop = Scripted([{"trainer.lr": 1e-4}, {"trainer.lr": 1e-3}, {"trainer.lr": 3e-4}])
    res = start_search(p, b, tmp_path / "s", runner=runner, proposer=prop, log=lambda s: None)
    assert runner.calls == [(base, 0), (base, 1), (1e-4, 0), (1e-3, 0), (1e-3, 1), (3e-4, 0), (3e-4, 1)]
    rows = read_results(tmp_path / "s")
    assert [r["decision"] for r in rows] == ["baseline", "reverted", "reverted", "kept"]
    assert "within noise" in rows[1]["reason"] and rows[1]["seeds"] == "[0]"
    assert rows[2]["seeds"] == "[0, 1]" and float(rows[2]["metric"]) == pytest.approx(0.6)
    assert res.incumbent["params"] == {"trainer.lr": 3e-4} and res.incumbent["seeds"] == [0, 1]
    assert prop.baselines == [({"trainer.lr": base}, pytest.approx(0.55))]
    assert json.loads(rows[3]["diff"]) == {"trainer.lr": 3e-4}
    assert rows[3]["proposer"] == "test" and float(rows[3]["wall_s"]) >= 0


def test_a_failing_base_config_stops_with_a_clear_error(write_program, tmp_path):
    p, b = write_program(set={"task.options.mode": "crash"})
    with pytest.raises(SearchError, match="the base config failed on every seed"):
        start_search(p, b, tmp_path / "s", runner=fake_subprocess_runner(b), proposer=Scripted([]),
                     log=lambda s: None)


class StopAt:
    """Runs fake trials in process; raises KeyboardInterrupt (a user's Ctrl-C) when trial `stop` starts."""

    def __init__(self, stop=None):
        self.stop, self.names = stop, []

    def __call__(self, spec, on_eval=None):
        if self.stop and spec.name.startswith(f"trial-{self.stop:03d}"):
            spec.run_dir.mkdir(parents=True)  # it had started: a half-written run directory is left behind
            raise KeyboardInterrupt
        self.names.append(spec.name)
        lr = params_of(spec)["trainer.lr"]
        spec.run_dir.mkdir(parents=True)
        value = 1.0 - abs(__import__("math").log10(lr) + 4.5) / 2
        return Outcome("ok", value, spec.run_dir, 0.0)


def test_resume_continues_a_stopped_search(write_program, tmp_path):
    pytest.importorskip("optuna")
    import optuna

    p, b = write_program(budget={"trial": {"steps": 2}, "total": {"trials": 5}})
    d = tmp_path / "s"
    with pytest.raises(KeyboardInterrupt):
        start_search(p, b, d, runner=StopAt(stop=3), log=lambda s: None)
    rows = read_results(d)
    assert [r["trial"] for r in rows] == ["0", "1", "2"]
    state = json.loads((d / "search_state.json").read_text())
    assert state["next_trial"] == 3 and state["candidates"] == 2
    with pytest.raises(SearchError, match="already holds a search"):
        start_search(p, b, d, runner=StopAt(), log=lambda s: None)
    runner = StopAt()
    res = resume_search(d, runner=runner, log=lambda s: None)
    rows = read_results(d)
    assert [r["trial"] for r in rows] == ["0", "1", "2", "3", "4", "5"]  # 5 candidates in all, none twice
    assert runner.names[0] == "trial-003-s0-r2"  # the interrupted trial's directory is kept, the rerun gets its own
    assert res.stopped.startswith("5 trial(s) done")
    # the same Optuna study: baseline + 5 completed, the interrupted one marked failed
    study = optuna.load_study(study_name="posttrain-auto", storage=f"sqlite:///{d / 'optuna.db'}")
    states = [t.state.name for t in study.trials]
    assert states.count("COMPLETE") == 6 and states.count("FAIL") == 1
    assert (d / "report.html").exists()
    # resuming a finished search changes nothing
    resume_search(d, runner=StopAt(), log=lambda s: None)
    assert len(read_results(d)) == 6


class EvalRunner:
    """Reports intermediate evals (the final value at steps 1..3) and stops when told to prune."""

    def __init__(self):
        self.stopped_early = []

    def __call__(self, spec, on_eval=None):
        lr = params_of(spec)["trainer.lr"]
        value = 1.0 - abs(__import__("math").log10(lr) + 4.5) / 2
        spec.run_dir.mkdir(parents=True)
        for step in (1, 2, 3):
            if on_eval is not None and on_eval(step, value):
                self.stopped_early.append((spec.name, step))
                return Outcome("pruned", None, spec.run_dir, 0.0, f"pruned at step {step}")
        return Outcome("ok", value, spec.run_dir, 0.0)


def test_optuna_prunes_on_intermediate_evals_and_the_report_has_importance(write_program, tmp_path):
    pytest.importorskip("optuna")
    pytest.importorskip("plotly")
    p, b = write_program(budget={"trial": {"steps": 3}, "total": {"trials": 10}}, pruning=True,
                         search={"trainer.lr": {"low": 1e-6, "high": 1e-2, "log": True},
                                 "sampling.temperature": {"low": 0.5, "high": 1.0}})
    runner = EvalRunner()
    start_search(p, b, tmp_path / "s", runner=runner, log=lambda s: None)
    rows = read_results(tmp_path / "s")
    assert len(rows) == 11
    pruned = [r for r in rows if r["status"] == "pruned"]
    assert pruned and all(r["decision"] == "pruned" for r in pruned) and runner.stopped_early
    page = (tmp_path / "s/report.html").read_text()
    assert "Parameter importance" in page and "Metric per trial" in page and "fig-param-1" in page


def test_cli_runs_a_search_end_to_end_with_fake_trials(write_program, tmp_path, monkeypatch):
    """`posttrain auto` through typer (in process, the trial command swapped for the fake)."""
    pytest.importorskip("optuna")
    from typer.testing import CliRunner

    from posttrain import cli
    from posttrain.auto import runner as runner_mod

    monkeypatch.setattr(runner_mod.SubprocessRunner, "__init__", _init_fake)
    p, b = write_program(budget={"trial": {"steps": 2}, "total": {"trials": 2}})
    r = CliRunner().invoke(cli.app, ["auto", str(p), str(b), "--out", str(tmp_path / "s")])
    assert r.exit_code == 0, r.output
    assert "results:" in r.output and len(read_results(tmp_path / "s")) == 3
    r = CliRunner().invoke(cli.app, ["auto", "--resume", str(tmp_path / "s")])
    assert r.exit_code == 0 and len(read_results(tmp_path / "s")) == 3
    r = CliRunner().invoke(cli.app, ["auto", "--resume", str(tmp_path / "nope")])
    assert r.exit_code == 2 and "holds no search to resume" in r.output


def _init_fake(self, metric, base_config=None, **kw):
    self.metric, self.base_config, self.poll_s = metric, base_config, 0.1
    self.command = [sys.executable, str(FAKE)]


class PruneEverything(Scripted):
    """Prunes at every intermediate eval it is shown; records the steps."""

    def __init__(self, params_list):
        super().__init__(params_list)
        self.shown = []

    def intermediate(self, p, step, value):
        self.shown.append(step)
        return True


def test_the_last_eval_is_never_pruned(write_program, tmp_path):
    """A trial that reaches its final eval has its result: the proposer sees evals before the last step only."""
    p, b = write_program(budget={"trial": {"steps": 3}, "total": {"trials": 2}}, pruning=True)
    prop = PruneEverything([{"trainer.lr": 1e-4}, {"trainer.lr": 3e-5}])
    runner = EvalRunner()
    start_search(p, b, tmp_path / "s", runner=runner, proposer=prop, log=lambda s: None)
    assert prop.shown == [1, 1] and runner.stopped_early == [("trial-001-s0", 1), ("trial-002-s0", 1)]
    p2, b2 = write_program(budget={"trial": {"steps": 1}, "total": {"trials": 1}}, pruning=True)
    prop = PruneEverything([{"trainer.lr": 3e-5}])
    start_search(p2, b2, tmp_path / "s2", runner=EvalRunner(), proposer=prop, log=lambda s: None)
    assert prop.shown == [] and read_results(tmp_path / "s2")[1]["status"] == "ok"


class SlowRunner(TableRunner):
    def __init__(self, table, seconds):
        super().__init__(table)
        self.seconds = seconds

    def __call__(self, spec, on_eval=None):
        __import__("time").sleep(self.seconds)
        return super().__call__(spec, on_eval)


def test_no_trial_starts_that_would_run_past_the_total_minutes(write_program, tmp_path):
    """3.6 s in all, 1 s per seed run: baseline 2 s, one candidate to 3 s; a second would end near 4 s, past the
    budget, so it is not started (the old rule, `used < budget`, started it)."""
    p, b = write_program(budget={"trial": {"steps": 2}, "total": {"trials": 10, "minutes": 0.06}})
    runner = SlowRunner({(2e-5, 0): 0.5, (2e-5, 1): 0.5, (1e-4, 0): 0.4, (3e-4, 0): 0.4}, 1.0)
    res = start_search(p, b, tmp_path / "s", runner=runner, proposer=Scripted([{"trainer.lr": 1e-4},
                                                                             {"trainer.lr": 3e-4}]),
                       log=lambda s: None)
    assert len(read_results(tmp_path / "s")) == 2 and len(runner.calls) == 3
    assert "the next one would run past budget.total.minutes" in res.stopped
