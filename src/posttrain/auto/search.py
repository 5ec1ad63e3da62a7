"""The search loop of `posttrain auto`: baseline, then propose -> run -> judge -> keep or revert, until the budget ends.

    SEARCH_DIR/program.md, base.yaml   the inputs, copied at the start (--resume reads these)
    SEARCH_DIR/results.tsv             one row per trial, appended and flushed after each
    SEARCH_DIR/search_state.json       the incumbent, the next trial number, time used: what --resume needs
    SEARCH_DIR/optuna.db               the Optuna study (sqlite)
    SEARCH_DIR/trials/trial-NNN-sS/    each trial seed's normal run directory
    SEARCH_DIR/logs/trial-NNN-sS.log   its console output
    SEARCH_DIR/best.yaml, report.html  the incumbent's config; the search's report

Trial 0 is the base config on both seeds: the first incumbent, and the seed spread every candidate must beat.
A candidate runs on the first seed (pruned by the proposer on its intermediate evals); if it beats the incumbent
by more than the noise it is re-run on the second seed and judged on both (rules.judge). With `parallel: 2` every
trial runs both seeds at once instead (two processes: the second core is not left idle) and is judged on both. A
crash, a timeout or a prune is a failed trial row, and the loop goes on.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean
from typing import Any

from posttrain.auto.program import Program, base_data, base_params, fmt_value, load_program
from posttrain.auto.results import RESULTS, read_results
from posttrain.auto.rules import Verdict, judge
from posttrain.auto.runner import OnEval, Outcome, SubprocessRunner, TrialRunner, TrialSpec
from posttrain.errors import PosttrainError

COLUMNS = [
    "trial",
    "status",
    "decision",
    "metric",
    "values",
    "seeds",
    "diff",
    "reason",
    "proposer",
    "wall_s",
    "params",
    "run_dirs",
]
STATE = "search_state.json"


class SearchError(PosttrainError, RuntimeError):
    """The search cannot go on (the base config fails, a directory that holds no search): a clear message."""


@dataclass
class SearchResult:
    search_dir: Path
    incumbent: dict[str, Any]
    trials: int
    stopped: str
    report: Path | None


def _value(o: Outcome) -> float:
    """An "ok" outcome's metric: a runner reports "ok" only with a value (SubprocessRunner fails a run without)."""
    assert o.value is not None, f"an ok outcome without a value: {o}"
    return o.value


def start_search(
    program: str | Path, base_config: str | Path | None = None, out: str | Path | None = None, **kw: Any
) -> SearchResult:
    """A new search: validate program.md against the base config, copy both into the search dir, run."""
    prog = load_program(program, base_config)  # every error before anything is written
    if out is None:
        from posttrain.obs.run_dir import make_run_dir

        parent = (base_data(base_config).get("run") or {}).get("output_dir", "runs")
        out = make_run_dir(parent, None, "auto")
    d = Path(out)
    if (d / STATE).exists():
        raise SearchError(f"{d} already holds a search; continue it with posttrain auto --resume {d}")
    if d.exists() and any(d.iterdir()):
        raise SearchError(f"{d} exists and is not empty; pick a new --out")
    d.mkdir(parents=True, exist_ok=True)
    (d / "program.md").write_text(prog.text)
    if base_config is not None:
        shutil.copyfile(base_config, d / "base.yaml")
    return Search(d, **kw).run()


def resume_search(search_dir: str | Path, **kw: Any) -> SearchResult:
    d = Path(search_dir)
    if not (d / STATE).exists():
        raise SearchError(f"{d} holds no search to resume (no {STATE})")
    return Search(d, **kw).run()


class Search:
    def __init__(
        self,
        search_dir: Path,
        runner: TrialRunner | None = None,
        proposer: Any = None,
        log: Callable[[str], None] | None = None,
        client: Any = None,
    ):
        self.dir = Path(search_dir)
        base = self.dir / "base.yaml"
        self.base_config = base if base.exists() else None
        self.prog: Program = load_program(self.dir / "program.md", self.base_config)
        self.base_params = base_params(self.prog, base_data(self.base_config))
        self.log = log or (lambda s: print(s, flush=True))
        self.runner = runner or SubprocessRunner(self.prog.metric, self.base_config)
        if proposer is None:
            from posttrain.auto.proposers import make_proposer

            proposer = make_proposer(self.prog, self.dir, client)
        self.proposer = proposer
        self.state: dict[str, Any] = (
            json.loads((self.dir / STATE).read_text())
            if (self.dir / STATE).exists()
            else {"version": 1, "next_trial": 0, "candidates": 0, "incumbent": None, "elapsed_s": 0.0, "stopped": None}
        )
        self.state["next_trial"] = max(self.state["next_trial"], self._last_row_trial() + 1)
        self._t = time.monotonic()
        self._clock = threading.Lock()  # parallel seeds tick the elapsed time from their threads

    # ---- the loop ----------------------------------------------------------------------------------------
    def run(self) -> SearchResult:
        self.log(f"search dir: {self.dir} (stop with Ctrl-C; continue with posttrain auto --resume {self.dir})")
        if self.state["incumbent"] is not None:
            self.log(
                f"resuming {self.dir}: trial {self.state['next_trial']}, {self.state['candidates']} candidate(s) "
                f"done, {self.state['elapsed_s'] / 60:.1f} min used"
            )
        try:
            if self.state["incumbent"] is None:
                self._baseline()
            while (why := self._exhausted()) is None:
                self._candidate(self.state["next_trial"])
        finally:
            self._save()
        self.state["stopped"] = why
        self._save()
        inc = self.state["incumbent"]
        assert inc is not None  # _baseline set it or raised
        self._write_best(inc)
        report = self._report()
        self.log(
            f"stopped: {why}. incumbent: trial {inc['trial']} {self.prog.metric}={fmean(inc['values']):.4g} "
            f"diff {json.dumps(self._diff(inc['params']))} -> {self.dir}"
        )
        llm_rej = getattr(self.proposer, "rejected", None)
        if llm_rej:
            self.log(f"LLM proposals rejected: {llm_rej} (Optuna proposed instead)")
        return SearchResult(self.dir, inc, self.state["next_trial"], why, report)

    def _exhausted(self) -> str | None:
        p = self.prog
        if p.total_trials is not None and self.state["candidates"] >= p.total_trials:
            return f"{p.total_trials} trial(s) done (budget.total.trials)"
        if p.total_minutes is not None:
            used, budget = self._elapsed(), p.total_minutes * 60
            if used >= budget:
                return f"{p.total_minutes:g} min used (budget.total.minutes)"
            if used + (need := self._trial_estimate()) > budget:
                return (
                    f"{used / 60:.1f} of {p.total_minutes:g} min used, and a trial takes about {need / 60:.1f} min "
                    "(the median so far): the next one would run past budget.total.minutes"
                )
        return None

    def _trial_estimate(self) -> float:
        """Seconds a candidate is expected to take: the median wall time of the candidates so far (pruned ones
        included), else the baseline's per candidate (it ran every seed; a candidate runs one unless confirmed)."""
        rows = [r for r in read_results(self.dir) if r.get("wall_s")]
        walls = [float(r["wall_s"]) for r in rows if r["decision"] != "baseline"]
        if walls:
            return statistics.median(walls)
        for r in rows:
            if r["decision"] == "baseline":  # its seeds ran one after another, or all at once (parallel)
                runs = 1 if self.prog.parallel > 1 else max(len(json.loads(r["run_dirs"])), 1)
                return float(r["wall_s"]) / runs
        return 0.0

    def _baseline(self) -> None:
        t0, params = time.monotonic(), self.base_params
        self.log(f"trial 0: the base config on seeds {self.prog.seeds} (the incumbent and its seed spread)")
        outs = self._run_seeds(0, params, None)
        ok = [o for o in outs if o.status == "ok"]
        errors = "; ".join(
            f"seed {s}: {o.status}: {o.error}" for s, o in zip(self.prog.seeds, outs) if o.status != "ok"
        )
        if not ok:
            self._row(0, "failed", "failed", [], [], params, errors, "base", time.monotonic() - t0, outs)
            raise SearchError(
                f"the base config failed on every seed ({errors}); the search needs it as the first "
                f"incumbent: fix it (logs in {self.dir / 'logs'}) and start again"
            )
        seeds = [s for s, o in zip(self.prog.seeds, outs) if o.status == "ok"]
        vals = [_value(o) for o in ok]
        reason = "the base config" + (
            f" (noise floor only: {errors})" if errors else f" (seed spread {max(vals) - min(vals):.4g})"
        )
        self._row(0, "ok", "baseline", vals, seeds, params, reason, "base", time.monotonic() - t0, outs)
        self.proposer.baseline(params, fmean(vals))
        self.state["incumbent"] = {
            "trial": 0,
            "params": params,
            "values": vals,
            "seeds": seeds,
            "run_dirs": [f"trials/{o.run_dir.name}" for o in ok],
        }
        self.state["next_trial"] = 1
        self._save()

    def _candidate(self, n: int) -> None:
        t0, inc, prog = time.monotonic(), self.state["incumbent"], self.prog
        prop = self.proposer.propose(dict(inc["params"]), self._history())
        self.log(f"trial {n} ({prop.source}): {json.dumps(self._diff(prop.params))} - {prop.reason}")
        outs = (
            self._run_seeds(n, prop.params, prop)
            if prog.parallel > 1
            else [self._run(n, prog.seeds[0], prop.params, prop)]
        )
        o1 = outs[0]
        if o1.status != "ok":
            self.proposer.finish(prop, None, "pruned" if o1.status == "pruned" else "failed")
            self._row(
                n,
                o1.status,
                "pruned" if o1.status == "pruned" else "failed",
                [],
                [],
                prop.params,
                f"{prop.reason} | {o1.error}",
                prop.source,
                time.monotonic() - t0,
                outs,
            )
            return self._next(n)
        vals, seeds = [_value(o1)], [prog.seeds[0]]
        v = judge(vals, inc["values"], prog.direction, prog.noise)
        if len(outs) > 1 or v.action == "confirm":
            if len(outs) > 1:  # parallel: the second seed already ran, whatever the first one scored
                o2 = outs[1]
            else:
                self.log(f"  {v.reason}")
                o2 = self._run(n, prog.seeds[1], prop.params, None)
                outs.append(o2)
            if o2.status == "ok":
                vals.append(_value(o2))
                seeds.append(prog.seeds[1])
                v = judge(vals, inc["values"], prog.direction, prog.noise)
            else:
                v = Verdict(
                    "reject",
                    v.margin,
                    v.noise,
                    f"the {'second' if prog.parallel > 1 else 'confirmation'}"
                    f" seed {prog.seeds[1]} {o2.status}: {o2.error}",
                )
        self.proposer.finish(prop, fmean(vals), "complete")
        kept = v.action == "accept"
        if kept:
            self.state["incumbent"] = {
                "trial": n,
                "params": dict(prop.params),
                "values": vals,
                "seeds": seeds,
                "run_dirs": [f"trials/{o.run_dir.name}" for o in outs if o.status == "ok"],
            }
        self.log(f"  trial {n}: {'KEPT' if kept else 'reverted'}: {v.reason}")
        self._row(
            n,
            "ok",
            "kept" if kept else "reverted",
            vals,
            seeds,
            prop.params,
            f"{prop.reason} | {v.reason}",
            prop.source,
            time.monotonic() - t0,
            outs,
        )
        self._next(n)

    def _next(self, n: int) -> None:
        self.state["candidates"] += 1
        self.state["next_trial"] = n + 1
        self._save()

    def _run_seeds(self, n: int, params: dict[str, Any], prop: Any) -> list[Outcome]:
        """One trial on every seed: one after another, or all at once with `parallel: 2`.

        Only the first seed's intermediate evals go to the proposer (one pruning report per step). With a proposal
        (a candidate, not the baseline), a first seed that is pruned or fails stops the others: the trial is lost
        either way. Ctrl-C or an error here takes every seed's process group down with the search.
        """
        if self.prog.parallel == 1:
            return [self._run(n, s, params, prop if i == 0 else None) for i, s in enumerate(self.prog.seeds)]
        cancel = threading.Event()

        def one(i: int, seed: int) -> Outcome:
            o = self._run(n, seed, params, prop if i == 0 else None, cancel)
            if i == 0 and prop is not None and o.status != "ok":
                cancel.set()
            return o

        with ThreadPoolExecutor(len(self.prog.seeds), thread_name_prefix=f"trial-{n:03d}") as pool:
            futures = [pool.submit(one, i, s) for i, s in enumerate(self.prog.seeds)]
            try:
                return [f.result() for f in futures]
            except BaseException:
                cancel.set()
                raise

    def _run(
        self, n: int, seed: int, params: dict[str, Any], prop: Any, cancel: threading.Event | None = None
    ) -> Outcome:
        name = f"trial-{n:03d}-s{seed}"
        trials = self.dir / "trials"
        i = 2
        while (trials / name).exists():  # a trial interrupted by a stop: its rerun gets a new directory
            name = f"trial-{n:03d}-s{seed}-r{i}"
            i += 1
        overrides = self.prog.trial_overrides() + [f"{k}={fmt_value(v)}" for k, v in params.items()]
        spec = TrialSpec(name, overrides, seed, self.prog.timeout_s, trials, self.dir / "logs" / f"{name}.log", cancel)
        on_eval: OnEval | None = None
        if prop is not None and self.prog.pruning:

            def report_eval(step: int, value: float) -> bool:
                if self.prog.steps is not None and step >= self.prog.steps:
                    return False  # the last eval is the trial's result: pruning it only throws a finished run away
                try:
                    return self.proposer.intermediate(prop, step, value)
                except Exception as e:  # noqa: BLE001 - pruning is an optimisation: never lose the trial to it
                    self.log(f"  warning: could not report step {step} to the proposer: {e}")
                    return False

            on_eval = report_eval

        try:
            o = self.runner(spec, on_eval)
        except Exception as e:  # noqa: BLE001 - the runner itself failing is a failed trial, not the end
            o = Outcome("failed", None, spec.run_dir, 0.0, f"runner error: {type(e).__name__}: {e}")
        val = f" {self.prog.metric}={o.value:.4g}" if o.value is not None else ""
        self.log(f"  {name}: {o.status}{val} [{o.wall_s:.0f}s]{' ' + o.error if o.error else ''}")
        self._tick()
        return o

    # ---- files -------------------------------------------------------------------------------------------
    def _diff(self, params: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in params.items() if v != self.base_params.get(k)}

    def _row(self, n, status, decision, vals, seeds, params, reason, source, wall, outs) -> None:
        path = self.dir / RESULTS
        new = not path.exists()
        cells = [
            n,
            status,
            decision,
            f"{fmean(vals):.6g}" if vals else "",
            json.dumps(vals),
            json.dumps(seeds),
            json.dumps(self._diff(params)),
            reason,
            source,
            f"{wall:.1f}",
            json.dumps(params),
            json.dumps([o.run_dir.name for o in outs]),
        ]
        with open(path, "a") as f:
            if new:
                f.write("\t".join(COLUMNS) + "\n")
            f.write("\t".join(str(c).replace("\t", " ").replace("\n", " ") for c in cells) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def _history(self) -> str:
        p = self.dir / RESULTS
        return p.read_text() if p.exists() else ""

    def _last_row_trial(self) -> int:
        rows = read_results(self.dir)
        return max((int(r["trial"]) for r in rows), default=-1) if self.state.get("incumbent") else -1

    def _tick(self) -> None:
        with self._clock:
            now = time.monotonic()
            self.state["elapsed_s"] += now - self._t
            self._t = now

    def _elapsed(self) -> float:
        return self.state["elapsed_s"] + time.monotonic() - self._t

    def _save(self) -> None:
        self._tick()
        tmp = self.dir / (STATE + ".tmp")
        tmp.write_text(json.dumps(self.state, indent=2))
        os.replace(tmp, self.dir / STATE)

    def _write_best(self, inc: dict[str, Any]) -> None:
        src = self.dir / inc["run_dirs"][0] / "config.yaml" if inc.get("run_dirs") else None
        if src is not None and src.exists():
            shutil.copyfile(src, self.dir / "best.yaml")

    def _report(self) -> Path | None:
        try:
            from posttrain.auto.report import write_search_report

            return write_search_report(self.dir)
        except Exception as e:  # noqa: BLE001 - the search's results are in results.tsv either way
            self.log(f"warning: could not write the search report: {e}")
            return None
