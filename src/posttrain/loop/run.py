"""A Run: everything about a training job except how one step trains.

    Run(cfg).run():  build components ─► env check ─► [warm start] ─► stepper = make_stepper(cfg)
                     ─► [resume] ─► eval before ─► for each step: stepper.step(i), log, watch (diagnostics,
                     remedies), eval every N, checkpoint every N, time budget ─► checkpoint ─► eval after
                     ─► final/ ─► summary.json

The Run owns the run directory, console, metrics logger, eval schedule, checkpoints and resume, the time
budget and the summary. It drives a Stepper (loop/stepper.py: each step returns a StepResult); loop/wiring.py
picks which one.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from posttrain.cluster.ray_grading import start_grading
from posttrain.config.load import to_yaml
from posttrain.config.schema import Config
from posttrain.errors import MissingFileError
from posttrain.guidance.insights import evaluate_with_insights
from posttrain.loop.best_model import BestModel
from posttrain.loop.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from posttrain.loop.components import Components, build
from posttrain.loop.eval_suite import SuiteSettings, run_suite_async, suite_tasks
from posttrain.loop.evaluate import evaluate_async
from posttrain.loop.judge_audit import gate as judge_gate
from posttrain.loop.reference import reference_after_warm_start, restore_reference
from posttrain.loop.start_checks import check_names, check_suite_prompts, check_task
from posttrain.loop.stepper import Stepper
from posttrain.loop.warm_start import WarmStartResult, run_warm_start
from posttrain.loop.watch import Watch
from posttrain.loop.wiring import make_stepper
from posttrain.models.save import save_hf_folder
from posttrain.obs import console as con
from posttrain.obs import trace
from posttrain.obs.memory import memory_metrics, peak_rss_mb
from posttrain.obs.metrics import MetricsLogger
from posttrain.obs.rollout_stats import sample_records
from posttrain.obs.run_dir import make_run_dir, write_run_info
from posttrain.obs.sinks import tracker_sinks
from posttrain.rewards.telemetry import drain_task_metrics
from posttrain.types import SampleParams

STEPPER_FILE = "stepper.pt"

if TYPE_CHECKING:  # cluster.envs=ray only
    from posttrain.cluster.ray_episodes import EnvWorkers


@dataclass
class RunResult:
    run_dir: Path
    before: dict[str, float]
    after: dict[str, float]
    steps: int
    seconds: float


class Run:
    def __init__(self, cfg: Config, run_dir: Path | None = None, resume: bool = False):
        self.cfg, self.resume = cfg, resume
        self.t_start = time.perf_counter()
        check_names(cfg)  # a typo in an algorithm name fails before a run dir or minutes of model loading
        self.run_dir = Path(run_dir or make_run_dir(cfg.run.output_dir, cfg.run.name, cfg.task.label))
        self.say = partial(con.print_line, enabled=cfg.logging.console)
        if not resume:
            write_run_info(self.run_dir, to_yaml(cfg), cfg.run.seed)
        trace.start(self.run_dir / trace.TRACE_FILE)  # every stage's spans, for the report's timeline
        # cluster.sandbox=ray: from here on every sandboxed run (env check, rewards, eval) is a Ray task.
        self.grading = start_grading(cfg.cluster)
        built: Components | None = None
        try:
            self.c = built = build(cfg, log=self.say)
            check_task(cfg, self.c.task)  # loop.best_metric; the same checks as --dry-run (loop/start_checks.py)
            if cfg.task.env_check != "off":
                env_check(self.c, cfg.task.env_check, self.say, cfg.logging.console)
            judge_gate(cfg, self.c, self.say)  # judge.min_agreement / min_kappa: audit the judge first
            # What the env check and the audit scored is not the policy's: keep it out of the first eval's or step's
            # task metrics (the warm start drains its own demonstrations the same way). Not done at each eval: in
            # async mode the collector scores training rollouts while an eval runs.
            drain_task_metrics(self.c.task)
        except BaseException:
            trace.stop()  # the run never starts: its trace is not left open for whatever runs next in this process
            self._close_cluster(built.env_workers if built is not None else None)
            raise
        self.eval_rows = self.c.task.eval_rows[: cfg.loop.eval_prompts]
        self.best = BestModel(cfg.loop.best_metric, self.run_dir / "best", say=self.say)
        self.suite = suite_tasks(cfg.eval_suite, cfg.run.seed)  # other tasks, pass@k (loop/eval_suite.py)
        check_suite_prompts(self.suite, self.c.sampler.context.max_context)
        self.final_step: int | None = None
        self.suite_before: dict[str, float] = {}
        self.suite_after: dict[str, float] = {}  # the step whose model final/ holds, once exported
        self.logger = MetricsLogger(
            str(self.run_dir), tensorboard=cfg.logging.tensorboard, sinks=tracker_sinks(cfg, self.run_dir)
        )
        self.watch = Watch(
            cfg, self.logger.log, self.say, has_format_hints=any(r.get("format_hint") for r in self.c.task.train_rows)
        )

    def run(self) -> RunResult:
        return asyncio.run(self.run_async())

    async def run_async(self) -> RunResult:
        cfg, c = self.cfg, self.c
        self.say(f"run dir: {self.run_dir}")
        for d in cfg.derived:  # settings derived from others (config/schema.py): shown, never silent
            self.say(f"config: {d}")
        self.say(
            f"model: {cfg.model.name} ({c.trainable_params / 1e6:.1f}M trainable of {c.total_params / 1e6:.1f}M)"
            f" | task: {c.task.name} ({len(c.task.train_rows)} train / {len(self.eval_rows)} held-out prompts)"
            f" | {cfg.loop.steps} steps x {cfg.loop.prompts_per_step} prompts x G={cfg.algorithm.num_generations}"
        )
        start, before, warm, base_eval = 0, {}, None, {}
        ckpt = latest_checkpoint(self.run_dir) if self.resume else None
        if self.resume and ckpt is None:
            raise MissingFileError(f"no checkpoint to resume from in {self.run_dir}/checkpoints")
        if cfg.warm_start.steps and ckpt is None:
            warm, base_eval = await self._warm_start()
            if (ref := reference_after_warm_start(cfg, c, self.run_dir)) is not None:
                c = self.c = replace(c, ref_model=ref)
                self.say("KL reference: the warm-started policy")
        elif ckpt is not None and (ref := restore_reference(cfg, c, self.run_dir)) is not None:
            c = self.c = replace(c, ref_model=ref)  # the warm-started reference, saved when it was made
        stepper: Stepper = make_stepper(cfg, c, self.run_dir, self.say)
        if warm is not None and cfg.loop.keep_checkpoints:
            # A warm start can take an hour (coding-agent on CPU); a crash in RL (one OOM-killed at step 4 after
            # 54 min of warm start) must not lose it. `--resume` loads this and starts RL without redoing it.
            self._checkpoint(stepper, 0, {})
            self.say(f"warm-started model checkpointed: `posttrain train --resume {self.run_dir}` starts RL from it")
        try:
            try:
                if ckpt is not None:
                    state = load_checkpoint(ckpt, c.sampler.generator)
                    stepper.load_state_dict(torch.load(ckpt / STEPPER_FILE, map_location="cpu", weights_only=False))
                    start, before = state["step"], state.get("before", {})
                    self.best.load_state_dict(state.get("best", {}))
                    self.watch.resume(state.get("watch", {}), stepper)
                    _truncate_jsonl(self.run_dir / "metrics.jsonl", start)
                    _truncate_jsonl(self.run_dir / "samples.jsonl", start)
                    self.say(f"resumed from {ckpt} at step {start}")
                ws_eval = cfg.warm_start.eval  # the warm-started model's eval; None: as loop.eval_before
                eval_before = cfg.loop.eval_before if warm is None or ws_eval is None else ws_eval
                if not before and eval_before:
                    before = await self._eval(0, "before training" if warm is None else "after the warm start")
                    self.watch.observe({"kind": "eval", "step": 0, **before}, stepper)
                if start == 0:
                    self.suite_before = await self._suite(0)
                done = await self._train(stepper, start, before)
            finally:
                await stepper.close()  # stops rollout workers before the final eval
            last_eval = before
            if done > start:
                # Checkpoint before the final eval, so that resuming to train further continues exactly as an
                # uninterrupted run would (eval may consume sampler randomness).
                if cfg.loop.keep_checkpoints and not (cfg.loop.save_every and done % cfg.loop.save_every == 0):
                    self._checkpoint(stepper, done, before)
                last_eval = await self._eval(done, "after training")
                self.watch.observe({"kind": "eval", "step": done, **last_eval}, stepper)
                self.suite_after = await self._suite(done)
            if done > start or warm is not None:  # warm start only (loop.steps=0): its model is the result
                self._save_final(done)
        finally:
            self.logger.close()
            trace.stop()
            workers, self.c = self.c.env_workers, replace(self.c, env_workers=None)  # closed once
            self._close_cluster(workers)
        return self._summarize(before, last_eval, done, start, warm, base_eval)

    async def _train(self, stepper: Stepper, start: int, before: dict[str, float]) -> int:
        """Steps from `start`, with eval, checkpoints and the time budget. Returns the number of steps done."""
        cfg, done = self.cfg, start
        t_train = time.perf_counter()
        for i in range(start, cfg.loop.steps):
            result = await stepper.step(i)
            m, trajs = dict(result.metrics), result.trajectories
            if self.grading is not None:
                m.update(self.grading.drain_metrics())
            if self.c.env_workers is not None:
                m.update(self.c.env_workers.drain_metrics())
            m.update(memory_metrics())
            done = i + 1
            record = {"kind": "train", "step": done, **m}
            self.logger.log(record)
            if cfg.loop.samples_per_step:
                shown = sample_records(trajs, cfg.loop.samples_per_step, self.c.tokenizer, result.stats)
                self.logger.log_samples(done, shown)
            failed = next((t for t in trajs if t.failed and t.error), None)
            if failed is not None:
                self.say(f"  sample failed (kept out of training): {failed.error}")
            self.say(con.step_line(done, cfg.loop.steps, m))
            if done == 1 and cfg.logging.console:  # the first step measured what the preflight needs: say it
                self._preflight_verdicts(before, m)
            self.watch.observe(record, stepper)
            if cfg.loop.eval_every and done % cfg.loop.eval_every == 0 and done < cfg.loop.steps:
                m_eval = await self._eval(done, "held-out")
                self.watch.observe({"kind": "eval", "step": done, **m_eval}, stepper)
            if cfg.eval_suite.every and done % cfg.eval_suite.every == 0 and done < cfg.loop.steps:
                await self._suite(done)
            if cfg.loop.keep_checkpoints and cfg.loop.save_every and done % cfg.loop.save_every == 0:
                self._checkpoint(stepper, done, before)
            if cfg.loop.time_budget_s and time.perf_counter() - t_train >= cfg.loop.time_budget_s:
                self.say(f"time budget of {cfg.loop.time_budget_s:.0f}s reached after step {done}")
                break
        return done

    def _close_cluster(self, workers: EnvWorkers | None) -> None:
        """`workers`: the env workers the components started (None: none, or they were not built)."""
        if workers is not None:  # before grading's: whichever connected first owns (and shuts down) a private Ray
            workers.close()
        if self.grading is not None:
            grading, self.grading = self.grading, None
            grading.close()

    def _preflight_verdicts(self, before: dict[str, float], m: dict[str, Any]) -> None:
        """Diagnoses with advice from the eval before and the first step (obs/preflight_verdicts.py): no learning
        signal, saturation, truncation, reward errors, the time the whole run will take. Printing only."""
        from posttrain.obs.preflight_verdicts import diagnose, format_verdicts, measurements_from_metrics

        c = self.c
        meas = measurements_from_metrics(
            before=before,
            step=m,
            steps=self.cfg.loop.steps,
            num_generations=self.cfg.algorithm.num_generations,
            max_tokens=c.train_params.max_tokens,
            multi_turn=bool(c.task.tools),
            time_budget_s=self.cfg.loop.time_budget_s,
        )
        self.say(format_verdicts(diagnose(meas), f"preflight verdicts: {c.task.name}"))

    # ---- pieces ------------------------------------------------------------------------------------------
    async def _warm_start(self) -> tuple[WarmStartResult, dict[str, float]]:
        """Supervised steps on the task's demonstrations (loop/warm_start.py), evaluated before when eval_before."""
        c, base_eval = self.c, {}
        if self.cfg.loop.eval_before:
            base_eval, _ = await evaluate_async(
                c.env, c.sampler, self.eval_rows, c.eval_params, self.cfg.loop.eval_samples, progress=self.say
            )
            self.logger.log(
                {
                    "kind": "warm_start_eval",
                    "step": 0,
                    **{k.replace("eval/", "warm_start/base_eval/"): v for k, v in base_eval.items()},
                }
            )
            self.say(
                f"eval (before the warm start): pass_rate={base_eval['eval/pass_rate']:.3f} "
                f"reward={base_eval['eval/reward/mean']:.3f} [{base_eval['eval/seconds']:.1f}s]"
            )
        warm = await run_warm_start(
            self.cfg,
            c.model,
            c.tokenizer,
            c.env,
            c.task,
            c.train_params,
            c.tokenizer.pad_token_id,
            self.say,
            self.logger.log,
        )
        return warm, base_eval

    async def _eval(self, step: int, label: str) -> dict[str, float]:
        with trace.span("eval", worker="trainer", step=step):
            m, trajs = await evaluate_async(
                self.c.env,
                self.c.sampler,
                self.eval_rows,
                self.c.eval_params,
                self.cfg.loop.eval_samples,
                progress=self.say,
            )
            ic = self.cfg.algorithm.insights
            if ic.enabled:  # RLTL;DR: pass@1 with the policy's own insights in context, beside the plain one
                m.update(
                    await evaluate_with_insights(
                        self.c.env,
                        self.c.sampler,
                        self.c.tokenizer,
                        trajs,
                        self.c.eval_params,
                        SampleParams(max_tokens=ic.max_tokens, temperature=ic.temperature, stop=["\n"]),
                    )
                )
        if self.cfg.loop.final_model == "best":
            self.best.observe(step, m, self._save_model)
        self.logger.log({"kind": "eval", "step": step, **m})
        self.logger.log_samples(step, [{"eval": True, **r} for r in sample_records(trajs, 4, self.c.tokenizer)])
        with_insights = f" with insights={m['eval/insights/pass_rate']:.3f}" if "eval/insights/pass_rate" in m else ""
        self.say(
            f"eval ({label}, step {step}): pass_rate={m['eval/pass_rate']:.3f}{with_insights} "
            f"reward={m['eval/reward/mean']:.3f} [{m['eval/seconds']:.1f}s]"
        )
        m["eval/reward"] = m["eval/reward/mean"]
        return m

    async def _suite(self, step: int) -> dict[str, float]:
        """The eval suite (eval_suite.tasks) on the policy now: one `suite` record and a table."""
        if not self.suite:
            return {}
        s = self.cfg.eval_suite
        settings = SuiteSettings(samples=s.samples, temperature=s.temperature, max_tokens=self.c.eval_params.max_tokens)
        with trace.span("eval_suite", worker="trainer", step=step):
            result = await run_suite_async(self.suite, self.c.sampler, self.c.tokenizer, settings, progress=self.say)
        m = result.flat_metrics()
        self.logger.log({"kind": "suite", "step": step, **m})
        if self.cfg.logging.console:
            con.console.print(
                con.suite_table(f"eval suite at step {step} ({s.samples} samples per prompt)", result.table())
            )
        return m

    def _checkpoint(self, stepper: Stepper, step: int, before: dict[str, float]) -> None:
        save_checkpoint(
            self.run_dir,
            step,
            {STEPPER_FILE: stepper.state_dict()},
            self.c.sampler.generator,
            {"before": before, "watch": self.watch.state_dict(), "best": self.best.state_dict()},
            keep=self.cfg.loop.keep_checkpoints,
        )

    def _save_model(self, folder: Path) -> None:
        save_hf_folder(self.c.model, self.c.tokenizer, folder)  # atomic: a crash never leaves half a folder

    def _save_final(self, done: int) -> None:
        out = self.run_dir / "final"
        try:
            self.final_step, note = self.best.finish(out, self._save_model, done, self.cfg.loop.final_model == "best")
            self.say(note)
        except Exception as e:  # noqa: BLE001 - the checkpoint already holds the weights; report and go on
            self.say(f"warning: could not export the final model to {out}: {e}")

    def _summarize(self, before, last_eval, done, start, warm, base_eval) -> RunResult:
        elapsed = time.perf_counter() - self.t_start
        if warm is not None and base_eval:
            cols = [("base", _with_reward(base_eval)), ("warm start", before)]
            cols += [("after RL", last_eval)] if done > start else []
        else:
            cols = [("before", before), ("after", last_eval)]
        title = f"held-out ({len(self.eval_rows)} prompts): {' vs '.join(c for c, _ in cols)}"
        con.console.print(con.eval_table(title, cols)) if self.cfg.logging.console else None
        per_task = con.task_table("held-out by task", cols)
        if per_task is not None and self.cfg.logging.console:
            con.console.print(per_task)
        verdicts = self.watch.report(self.run_dir)
        if verdicts:
            self.say(verdicts)
        peak = peak_rss_mb()
        self.say(f"done in {elapsed / 60:.1f} min (peak memory {peak / 1024:.1f} GB) -> {self.run_dir}")
        summary: dict[str, Any] = {
            "before": before,
            "after": last_eval,
            "steps": done,
            "wall_seconds": elapsed,
            "peak_rss_mb": peak,
            "diagnostics": self.watch.summary(),
            "final": {
                "step": self.final_step,
                "model": self.cfg.loop.final_model,
                "best": {"metric": self.best.metric, **self.best.state_dict()},
            },
        }
        if self.suite:
            summary["suite"] = {"before": self.suite_before, "after": self.suite_after}
        if warm is not None:
            summary["warm_start"] = {**asdict(warm), "base_eval": base_eval}
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        return RunResult(self.run_dir, before, last_eval, done, elapsed)


def env_check(c: Components, mode: str, say, console: bool) -> None:
    """The task's smoke checks (known-good and known-bad answers, smoke commands) before any training."""
    from posttrain.envs.smoke_checks import EnvCheckError, check_task, results_table

    results = check_task(c.task)
    if all(r.ok for r in results):
        say(f"env check: {len(results)} check(s) ok")
        return
    if console:
        con.console.print(results_table(results, title=f"env check: {c.task.name}"))
    failed = "; ".join(f"{r.check}: expected {r.expected}, got {r.got}" for r in results if not r.ok)
    if mode == "refuse":
        raise EnvCheckError(
            f"env check failed for task {c.task.name!r}: {failed} (task.env_check=warn trains anyway)", results
        )
    say(f"warning: env check failed, training anyway (task.env_check=warn): {failed}")


def _with_reward(m: dict[str, float]) -> dict[str, float]:
    return {**m, "eval/reward": m["eval/reward/mean"]} if "eval/reward/mean" in m else m


def _truncate_jsonl(path: Path, max_step: int) -> None:
    """On resume, drop records written after the checkpoint (they will be produced again)."""
    if not path.exists():
        return
    # Warm-start records come before step 1 and are not redone on resume: always kept.
    keep = [
        line
        for line in path.read_text().splitlines()
        if line.strip()
        and (json.loads(line).get("step", 0) <= max_step or json.loads(line).get("kind", "").startswith("warm_start"))
    ]
    path.write_text("".join(line + "\n" for line in keep))


def train(cfg: Config, run_dir: Path | None = None, resume: bool = False) -> RunResult:
    """The high-level API: run a whole training job from a Config."""
    return Run(cfg, run_dir=run_dir, resume=resume).run()
