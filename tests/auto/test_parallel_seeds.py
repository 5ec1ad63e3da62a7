"""`parallel: 2`: a trial's two seeds run at the same time, are judged together, and a lost first seed stops the
second. The rule is the same as one after another: a candidate within the noise is reverted."""

import threading

import pytest

from auto_helpers import Scripted
from posttrain.auto.program import ProgramError, load_program
from posttrain.auto.runner import Outcome
from posttrain.auto.search import read_results, start_search
from test_search import fake_subprocess_runner, params_of


class TogetherRunner:
    """In-process: the metric is table[(lr, seed)]. Each call waits at a barrier for its sibling seed, so the
    search only gets through a trial if both seeds really run at once (one after another would break it)."""

    def __init__(self, table):
        self.table, self.calls, self.barrier = table, [], threading.Barrier(2, timeout=10)
        self.lock = threading.Lock()

    def __call__(self, spec, on_eval=None):
        lr = params_of(spec)["trainer.lr"]
        with self.lock:
            self.calls.append((lr, spec.seed, on_eval is not None))
        self.barrier.wait()
        spec.run_dir.mkdir(parents=True)
        return Outcome("ok", self.table[(lr, spec.seed)], spec.run_dir, 0.01)


def test_both_seeds_run_at_once_and_the_noise_rule_holds(write_program, tmp_path):
    p, b = write_program(budget={"trial": {"steps": 2}, "total": {"trials": 3}}, parallel=2, pruning=True)
    base = 2e-5
    table = {(base, 0): 0.50, (base, 1): 0.60,  # the incumbent: mean 0.55, spread 0.10
             (1e-4, 0): 0.62, (1e-4, 1): 0.64,  # +0.08: within noise, reverted although both seeds ran
             (1e-3, 0): 0.90, (1e-3, 1): 0.30,  # a win on seed 0 that seed 1 undoes (mean 0.60)
             (3e-4, 0): 0.80, (3e-4, 1): 0.75}  # a real win: mean 0.775
    runner = TogetherRunner(table)
    prop = Scripted([{"trainer.lr": 1e-4}, {"trainer.lr": 1e-3}, {"trainer.lr": 3e-4}])
    res = start_search(p, b, tmp_path / "s", runner=runner, proposer=prop, log=lambda s: None)
    assert sorted(runner.calls) == sorted([
        (base, 0, False), (base, 1, False),  # the baseline is never pruned
        (1e-4, 0, True), (1e-4, 1, False),   # only the first seed reports intermediate evals to the proposer
        (1e-3, 0, True), (1e-3, 1, False), (3e-4, 0, True), (3e-4, 1, False)])
    rows = read_results(tmp_path / "s")
    assert [r["decision"] for r in rows] == ["baseline", "reverted", "reverted", "kept"]
    assert "within noise" in rows[1]["reason"] and rows[1]["seeds"] == "[0, 1]"
    assert float(rows[2]["metric"]) == pytest.approx(0.6)
    assert res.incumbent["params"] == {"trainer.lr": 3e-4} and res.incumbent["values"] == [0.80, 0.75]
    # the proposer learns the mean of both seeds
    assert [v for _, v, _ in prop.finished] == pytest.approx([0.63, 0.60, 0.775])


def test_a_first_seed_that_crashes_stops_its_sibling(write_program, tmp_path):
    """Seed 0 crashes, seed 1 would hang for 120 s: the second is stopped, not left to the 30 s timeout."""
    p, b = write_program(search={"task.options.mode": {"choices": ["ok", "crash0"]},
                                 "trainer.lr": {"low": 1e-6, "high": 1e-2, "log": True}},
                         budget={"trial": {"steps": 2, "timeout_s": 30}, "total": {"trials": 2}}, parallel=2)
    prop = Scripted([{"task.options.mode": "crash0", "trainer.lr": 1e-4},
                     {"task.options.mode": "ok", "trainer.lr": 3e-5}])
    lines = []
    start_search(p, b, tmp_path / "s", runner=fake_subprocess_runner(b), proposer=prop, log=lines.append)
    rows = read_results(tmp_path / "s")
    assert [(r["status"], r["decision"]) for r in rows] == [("ok", "baseline"), ("failed", "failed"), ("ok", "kept")]
    stopped = [ln for ln in lines if "trial-001-s1:" in ln]
    assert len(stopped) == 1 and "pruned" in stopped[0] and "the trial's other seed was pruned or failed" in stopped[0]
    assert "boom (fake trial crashed)" in rows[1]["reason"]
    assert rows[1]["run_dirs"] == '["trial-001-s0", "trial-001-s1"]'
    assert (tmp_path / "s/logs/trial-001-s1.log").exists()
    log1 = (tmp_path / "s/logs/trial-001-s1.log").read_text()
    assert "run.seed=1" in log1 and not (tmp_path / "s/trials/trial-001-s1/summary.json").exists()
    assert rows[2]["seeds"] == "[0, 1]"


@pytest.mark.parametrize("bad", [3, 0, True, "2"])
def test_parallel_takes_one_or_two(write_program, bad):
    p, b = write_program(parallel=bad)
    with pytest.raises(ProgramError, match="parallel must be 1 .* or 2"):
        load_program(p, b)


def test_parallel_default_is_one(write_program):
    p, b = write_program()
    assert load_program(p, b).parallel == 1
