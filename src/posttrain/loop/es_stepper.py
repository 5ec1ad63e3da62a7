"""Evolution strategies as a stepper (`algorithm.name=es`): same envs, rewards, eval, logging and run directory
as policy gradient, no backward pass, no Trainer, no optimizer.

Each iteration: draw population/2 seeds; for each seed score theta + sigma*eps and theta - sigma*eps on the
step's prompts (the same sampler random state for every member: common random numbers, so members differ only
by their weights); shape the fitness by centred ranks; move theta along the weighted noise (algos/es.py).

Its state holds no weights: the seeds and weights of every iteration (~12 bytes per seed). Loading the state
replays that history onto the freshly loaded base model, which rebuilds the weights bit for bit.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from posttrain.algos.es import ESHistory, ESIteration, apply_update_, iteration_seeds, perturb_, replay_, shaped_weights
from posttrain.algos.prompt_selection import prompts_for_step
from posttrain.config.schema import Config
from posttrain.envs.base import TaskEnv
from posttrain.envs.isolate import safe_rollout, score_isolated
from posttrain.loop.stepper import StepResult
from posttrain.obs.remedies import Overrides
from posttrain.obs.rollout_stats import pass_rates, rollout_metrics
from posttrain.obs.timers import StageTimer
from posttrain.sampling.hf_sampler import HFSampler
from posttrain.types import SampleParams, Trajectory

HISTORY_FILE = "es_history.json"


class ESStepper:
    def __init__(
        self,
        cfg: Config,
        model: Any,
        env: TaskEnv,
        sampler: HFSampler,  # its generator is reseeded per member; versions are bumped here
        rows: list[dict[str, Any]],
        train_params: SampleParams,
        pass_thresholds: dict[str, float],
        run_dir: Path,
        say: Callable[[str], None] = print,
    ):
        es = cfg.algorithm.es
        if es.population % 2:
            raise ValueError(f"algorithm.es.population must be even (antithetic pairs), got {es.population}")
        self.cfg, self.env, self.sampler, self.rows = cfg, env, sampler, rows
        self.pass_thresholds, self.run_dir, self.say = pass_thresholds, Path(run_dir), say
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.base = [p.detach().clone() for p in self.params]
        self.history = ESHistory(sigma=es.sigma, lr=es.lr, population=es.population)
        self.fitness_params = SampleParams(
            max_tokens=train_params.max_tokens,
            temperature=es.temperature,
            top_p=train_params.top_p,
            top_k=train_params.top_k,
            stop=train_params.stop,
        )

    async def _fitness(self, rows: list[dict[str, Any]], timer: StageTimer) -> tuple[float, list[Trajectory]]:
        k = self.cfg.algorithm.es.samples_per_prompt
        with timer("sample"):
            rolled = list(
                await asyncio.gather(
                    *(safe_rollout(self.env, r, self.sampler, self.fitness_params) for r in rows for _ in range(k))
                )
            )
        with timer("reward"):
            trajs = await score_isolated(self.env, rolled)  # a sample whose rollout or scoring raised counts as failed
        ok = [t.reward for t in trajs if not t.failed]
        return (statistics.fmean(ok) if ok else 0.0), trajs

    async def step(self, step: int) -> StepResult:
        cfg, es = self.cfg, self.cfg.algorithm.es
        timer = StageTimer()
        rows = [self.rows[i] for i in prompts_for_step(len(self.rows), step, cfg.loop.prompts_per_step, cfg.run.seed)]
        seeds = iteration_seeds(cfg.run.seed, step, es.population // 2)
        rng_state = self.sampler.generator.get_state()
        f_plus, f_minus, trajs = [], [], []
        for seed in seeds:
            for sign, out in ((1.0, f_plus), (-1.0, f_minus)):
                with timer("perturb"):
                    perturb_(self.params, self.base, seed, sign * es.sigma)
                self.sampler.generator.set_state(rng_state)  # common random numbers across members
                f, tr = await self._fitness(rows, timer)
                out.append(f)
                trajs += tr
        it = ESIteration(seeds=seeds, weights=shaped_weights(f_plus, f_minus))
        with timer("train"):
            for p, b in zip(self.params, self.base):
                p.data.copy_(b)
            apply_update_(self.params, it, es.sigma, es.lr, es.population)
            self.base = [p.detach().clone() for p in self.params]
        self.history.iterations.append(it)
        with timer("sync"):  # the sampler holds the model itself
            self.sampler.set_version(self.sampler.policy_version + 1)
        fit = f_plus + f_minus
        n_tok = sum(t.num_completion_tokens for t in trajs)
        m: dict[str, Any] = {**rollout_metrics(trajs), **pass_rates(trajs, self.pass_thresholds)}
        m.update(
            {
                "es/fitness_mean": statistics.fmean(fit),
                "es/fitness_max": max(fit),
                "es/fitness_min": min(fit),
                "es/fitness_spread": max(fit) - min(fit),
                "es/weight_abs_mean": statistics.fmean(abs(w) for w in it.weights),
                "es/history_bytes_per_iteration": float(len(it.to_bytes())),
                "es/history_json_bytes": float(len(json.dumps(self.history.to_dict()))),
                "tokens/completion": float(n_tok),
                "perf/sample_tokens_per_s": n_tok / max(timer.seconds.get("sample", 0.0), 1e-9),
                "policy_version": float(self.sampler.policy_version),
            }
        )
        m.update(timer.metrics())
        m["time/step"] = sum(timer.seconds.values())
        return StepResult(m, trajs)  # no per-token stats: ES never runs a backward pass

    def apply_overrides(self, ov: Overrides) -> None:
        """Remedies steer policy-gradient steps (sampling temperature, lr scale, entropy bonus); loop/watch.py
        turns them off for ES runs, so nothing calls this with a change. Kept so ES is a whole Stepper."""
        del ov

    # ---- Stepper protocol --------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"es_history": self.history.to_dict(), "policy_version": self.sampler.policy_version}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history = ESHistory.from_dict(state["es_history"])
        replay_(self.params, self.history)
        self.base = [p.detach().clone() for p in self.params]
        self.sampler.set_version(state["policy_version"])

    async def close(self) -> None:
        if self.history.iterations:
            t0 = time.perf_counter()
            (self.run_dir / HISTORY_FILE).write_text(json.dumps(self.history.to_dict()))
            self.say(
                f"ES seed history: {len(self.history.iterations)} iterations, "
                f"{self.history.bytes_per_iteration():.0f} bytes/iteration binary, "
                f"{len(json.dumps(self.history.to_dict()))} bytes as JSON -> {self.run_dir / HISTORY_FILE} "
                f"[{time.perf_counter() - t0:.0f}s]"
            )
