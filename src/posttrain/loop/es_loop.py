"""Evolution strategies as a training loop (`algorithm.name=es`): same envs, rewards, eval, logging and run
directory as the RL loop, no backward pass.

Each iteration: draw population/2 seeds; for each seed score theta + sigma*eps and theta - sigma*eps on the
step's prompts (the same sampler random state for every member: common random numbers, so members differ only
by their weights); shape the fitness by centred ranks; move theta along the weighted noise (algos/es.py).

Checkpoints hold no weights: `es_history.json` (the seeds and weights of every iteration, ~12 bytes per seed)
plus the RNG and loop state. Resuming loads the base model and replays the history, which rebuilds the weights
bit for bit.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

from posttrain.algos.es import ESHistory, ESIteration, apply_update_, iteration_seeds, perturb_, replay_, shaped_weights
from posttrain.loop.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from posttrain.loop.rl_loop import RLLoop, _truncate_jsonl, prompts_for_step
from posttrain.obs import console as con
from posttrain.obs.rollout_stats import pass_rates, rollout_metrics, sample_records
from posttrain.obs.timers import StageTimer
from posttrain.types import SampleParams, Trajectory

HISTORY_FILE = "es_history.json"


class ESLoop(RLLoop):
    def __init__(self, cfg, run_dir: Path | None = None, resume: bool = False):
        self._es_ready = False
        super().__init__(cfg, run_dir=run_dir, resume=resume)
        self._setup_es()

    def _setup_es(self) -> None:
        if self._es_ready:
            return
        es = self.cfg.algorithm.es
        if es.population % 2:
            raise ValueError(f"algorithm.es.population must be even (antithetic pairs), got {es.population}")
        self.params = [p for p in self.c.model.parameters() if p.requires_grad]
        self.history = ESHistory(sigma=es.sigma, lr=es.lr, population=es.population)
        self.base = [p.detach().clone() for p in self.params]
        p = self.c.train_params
        self.fitness_params = SampleParams(max_tokens=p.max_tokens, temperature=es.temperature, top_p=p.top_p,
                                           top_k=p.top_k, stop=p.stop)
        self._es_ready = True

    # ---- checkpoints: a seed history, not weights ---------------------------------------------------------
    def _checkpoint(self, step: int) -> None:
        save_checkpoint(self.run_dir, step, None, self.c.sampler.generator,
                        {"before": self.before, "policy_version": self.c.sampler.policy_version},
                        keep=self.cfg.loop.keep_checkpoints,
                        extra_files={HISTORY_FILE: json.dumps(self.history.to_dict())})

    def _resume(self) -> None:
        self._setup_es()
        ckpt = latest_checkpoint(self.run_dir)
        if ckpt is None:
            raise FileNotFoundError(f"no checkpoint to resume from in {self.run_dir}/checkpoints")
        state = load_checkpoint(ckpt, None, self.c.sampler.generator)
        self.history = ESHistory.from_dict(json.loads((ckpt / HISTORY_FILE).read_text()))
        replay_(self.params, self.history)
        self.base = [p.detach().clone() for p in self.params]
        self.start_step = state["step"]
        self.before = state.get("before", {})
        self.c.sampler.policy_version = state.get("policy_version", self.start_step)
        _truncate_jsonl(self.run_dir / "metrics.jsonl", self.start_step)
        _truncate_jsonl(self.run_dir / "samples.jsonl", self.start_step)
        self.say(f"resumed from {ckpt} at step {self.start_step} (replayed {len(self.history.iterations)} ES iterations)")

    # ---- one iteration -----------------------------------------------------------------------------------
    async def _fitness(self, rows: list[dict[str, Any]], timer: StageTimer) -> tuple[float, list[Trajectory]]:
        c, k = self.c, self.cfg.algorithm.es.samples_per_prompt
        with timer("sample"):
            trajs = list(await asyncio.gather(*(c.env.rollout(r, c.sampler, self.fitness_params)
                                                for r in rows for _ in range(k))))
        with timer("reward"):
            await c.env.score(trajs)
        ok = [t.reward for t in trajs if not t.failed]
        return (statistics.fmean(ok) if ok else 0.0), trajs

    async def _train_step(self, step: int) -> dict[str, Any]:
        cfg, c, es = self.cfg, self.c, self.cfg.algorithm.es
        timer = StageTimer()
        rows = [c.task.train_rows[i] for i in prompts_for_step(len(c.task.train_rows), step,
                                                                cfg.loop.prompts_per_step, cfg.run.seed)]
        seeds = iteration_seeds(cfg.run.seed, step, es.population // 2)
        rng_state = c.sampler.generator.get_state()
        f_plus, f_minus, trajs = [], [], []
        for seed in seeds:
            for sign, out in ((1.0, f_plus), (-1.0, f_minus)):
                with timer("perturb"):
                    perturb_(self.params, self.base, seed, sign * es.sigma)
                c.sampler.generator.set_state(rng_state)  # common random numbers across members
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
        with timer("sync"):
            c.sampler.policy_version += 1
        m: dict[str, Any] = {}
        m.update(rollout_metrics(trajs))
        m.update(pass_rates(trajs, {x.name: x.pass_threshold for x in c.task.rubric.components}))
        fit = f_plus + f_minus
        n_tok = sum(t.num_completion_tokens for t in trajs)
        m.update({
            "es/fitness_mean": statistics.fmean(fit), "es/fitness_max": max(fit), "es/fitness_min": min(fit),
            "es/fitness_spread": max(fit) - min(fit), "es/weight_abs_mean": statistics.fmean(abs(w) for w in it.weights),
            "es/history_bytes_per_iteration": float(len(it.to_bytes())),
            "es/history_json_bytes": float(len(json.dumps(self.history.to_dict()))),
            "tokens/completion": float(n_tok),
            "perf/sample_tokens_per_s": n_tok / max(timer.seconds.get("sample", 0.0), 1e-9),
            "policy_version": float(c.sampler.policy_version),
        })
        m.update(timer.metrics())
        m["time/step"] = sum(timer.seconds.values())
        self.logger.log({"kind": "train", "step": step + 1, **m})
        if cfg.loop.samples_per_step:
            self.logger.log_samples(step + 1, sample_records(trajs, cfg.loop.samples_per_step))
        self.say(con.step_line(step + 1, cfg.loop.steps, m) +
                 f" fitness={m['es/fitness_mean']:.3f}[{m['es/fitness_min']:.3f},{m['es/fitness_max']:.3f}]")
        return m

    async def run_async(self):
        t0 = time.perf_counter()
        out = await super().run_async()
        if self.history.iterations:
            (self.run_dir / HISTORY_FILE).write_text(json.dumps(self.history.to_dict()))
            self.say(f"ES seed history: {len(self.history.iterations)} iterations, "
                     f"{self.history.bytes_per_iteration():.0f} bytes/iteration binary, "
                     f"{len(json.dumps(self.history.to_dict()))} bytes as JSON -> {self.run_dir / HISTORY_FILE} "
                     f"[{time.perf_counter() - t0:.0f}s]")
        return out
