"""The asynchronous RL loop (`loop.mode=async`): rollout workers and the trainer run at the same time.

    workers (asyncio tasks) ─► generate + env + reward per group ─► ready buffer ─► trainer (in a thread)
                 ▲                                                                   │
                 └──────────── weight sync: copy into the sampler's model ◄──────────┘

Producer-consumer as in the Tunix seed post. The sampler holds its own copy of the model, so the trainer can
update its weights while generation runs; each sync copies the trainable weights in (between decodes) and bumps
the policy version. Every completion records the version that produced it.

One staleness knob, `loop.max_staleness`, enforced at admission (loop/staleness.py): a worker does not start a
group until the sampler is recent enough, so no work is generated and then discarded. The trainer takes the
groups of step s in the data order (the same prompts as the sync loop) and checks the bound. The ratio between
the trainer's and the sampler's policy is corrected by the loss: ppo_clip's ratio is taken against the sampler's
log-probs (the behaviour policy), and `algorithm.is_correction=truncate` adds truncated importance sampling.

Metrics per step: ready-buffer depth, staleness histogram, trainer idle fraction (waiting for its batch),
sampler idle fraction (no generation in flight), busy seconds of model calls, rollouts (model + env) and rewards,
and train / weight-sync seconds. Resuming restarts the workers at the checkpoint's weights: in-flight rollouts
are not saved, so a resumed async run is not bit-identical to an uninterrupted one.
"""

from __future__ import annotations

import asyncio
import copy
import time
from typing import Any

from posttrain.algos import LossConfig
from posttrain.loop.rl_loop import RLLoop, prompts_for_step
from posttrain.loop.staleness import admissible, staleness_metrics
from posttrain.models.load import stop_token_ids
from posttrain.obs.timers import BusyMeter, StageTimer
from posttrain.sampling.hf_sampler import HFSampler
from posttrain.types import Batch, Completion, Group, SampleParams


class MeteredSampler:
    """Delegates to a sampler and records when generation is in flight."""

    def __init__(self, inner: HFSampler, meter: BusyMeter):
        self.inner, self.meter = inner, meter

    @property
    def policy_version(self) -> int:
        return self.inner.policy_version

    @policy_version.setter
    def policy_version(self, v: int) -> None:
        self.inner.policy_version = v

    @property
    def generator(self):
        return self.inner.generator

    async def sample(self, prompts_P: list[list[int]], params: SampleParams, n: int = 1) -> list[list[Completion]]:
        with self.meter():
            return await self.inner.sample(prompts_P, params, n)

    def decode(self, token_ids: list[int]) -> str:
        return self.inner.decode(token_ids)


class AsyncRLLoop(RLLoop):
    def __init__(self, cfg, run_dir=None, resume: bool = False):
        super().__init__(cfg, run_dir=run_dir, resume=resume)
        c = self.c
        # The sampler gets its own copy of the policy, so training and generation can overlap safely.
        sampler_model = copy.deepcopy(c.model).eval()
        inner = HFSampler(sampler_model, c.tokenizer, stop_token_ids(sampler_model, c.tokenizer), seed=cfg.run.seed)
        inner.generator.set_state(c.sampler.generator.get_state())
        inner.policy_version = c.sampler.policy_version
        self.meters = {k: BusyMeter() for k in ("model_call", "rollout", "reward")}
        c.sampler = MeteredSampler(inner, self.meters["model_call"])
        self.per_step = cfg.loop.prompts_per_step
        self.k = cfg.loop.max_staleness
        self.n_workers = cfg.loop.rollout_workers or self.per_step * (self.k + 1)
        self._ready: dict[int, Group] = {}
        self._cond: asyncio.Condition | None = None
        self._workers: list[asyncio.Task] = []
        self._next_group = 0
        self._failure: BaseException | None = None
        self._t_mark = time.perf_counter()
        self._busy_mark: dict[str, float] = {}

    # ---- producers ---------------------------------------------------------------------------------------
    def _start_workers(self, step: int) -> None:
        self._cond = asyncio.Condition()
        self._next_group = step * self.per_step
        self._workers = [asyncio.create_task(self._worker()) for _ in range(self.n_workers)]
        self._t_mark = time.perf_counter()
        self._busy_mark = {k: m.read() for k, m in self.meters.items()}

    async def _worker(self) -> None:
        cfg, c = self.cfg, self.c
        n_rows = len(c.task.train_rows)
        try:
            while True:
                i = self._next_group
                s = i // self.per_step
                if s >= cfg.loop.steps:
                    return
                self._next_group += 1
                async with self._cond:
                    await self._cond.wait_for(lambda: admissible(i, self.per_step, c.sampler.policy_version, self.k))
                row = prompts_for_step(n_rows, s, self.per_step, cfg.run.seed)[i % self.per_step]
                with self.meters["rollout"]():
                    (group,) = await self._sample_groups([row], StageTimer())
                async with self._cond:
                    self._ready[i] = group
                    self._cond.notify_all()
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # noqa: BLE001 - surface a worker crash in the trainer, don't hang it
            self._failure = e
            async with self._cond:
                self._cond.notify_all()

    async def _stop_workers(self) -> None:
        for w in self._workers:
            w.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        self._workers = []

    async def _training_done(self) -> None:
        await self._stop_workers()

    async def run_async(self):
        try:
            return await super().run_async()
        finally:
            await self._stop_workers()

    # ---- consumer ----------------------------------------------------------------------------------------
    async def _collect(self, step: int, timer: StageTimer) -> tuple[list[Group], list[Group], dict[str, float]]:
        if not self._workers:
            self._start_workers(step)
        want = range(step * self.per_step, (step + 1) * self.per_step)
        t0 = time.perf_counter()
        try:
            async with self._cond:
                await asyncio.wait_for(self._cond.wait_for(
                    lambda: self._failure is not None or all(i in self._ready for i in want)),
                    self.cfg.loop.batch_timeout_s)
        except asyncio.TimeoutError:
            missing = [i for i in want if i not in self._ready]
            raise TimeoutError(f"step {step}: groups {missing} not ready after loop.batch_timeout_s="
                               f"{self.cfg.loop.batch_timeout_s:g}s (a rollout, env or reward is hanging)") from None
        if self._failure is not None:
            raise RuntimeError(f"a rollout worker failed: {self._failure!r}") from self._failure
        wait_s = time.perf_counter() - t0
        groups = [self._ready.pop(i) for i in want]
        self._overlong_pen = self._overlong_pen[-len(want):]  # workers append per group; keep this step's
        version = self.c.sampler.policy_version  # == the trainer's weights: the last sync copied them
        token_versions = [t.policy_version for g in groups for t in g.trajectories_G]
        too_old = [v for v in token_versions if version - v > self.k]
        if too_old:  # admission makes this impossible; a violation is a bug, not a statistic
            raise RuntimeError(f"staleness bound broken: trainer at version {version}, tokens from {too_old[:3]}, "
                               f"max_staleness={self.k}")
        m = {"async/ready_groups": float(len(self._ready)), "async/trainer_wait_s": wait_s,
             **staleness_metrics(version, token_versions)}
        self._wait_s = wait_s
        return groups, groups, m

    async def _optimize(self, batch: Batch, loss_cfg: LossConfig, ref_lp) -> dict[str, Any]:
        """Train in a thread so the workers keep generating; score ratios against the sampler's log-probs."""
        c, m = self.c, {}
        old_lp = [list(s.sampler_logprobs) for s in batch.sequences]
        for _ in range(self.cfg.loop.num_iterations):
            m.update(await asyncio.to_thread(c.trainer.forward_backward, batch, self.loss_fn, loss_cfg, old_lp, ref_lp,
                                             self.token_weight_fn))
            m.update(await asyncio.to_thread(c.trainer.optim_step))
        return m

    async def _after_warm_start(self) -> None:
        # The sampler holds its own copy of the weights: copy the warm-started ones in, at the same version (no
        # train step happened, so admission control and the staleness bound are unchanged).
        state = {n: p.detach() for n, p in self.c.model.named_parameters() if p.requires_grad}
        await asyncio.to_thread(self.c.sampler.inner.load_weights, state, self.c.sampler.policy_version)

    async def _sync_weights(self) -> None:
        c = self.c
        t0 = time.perf_counter()
        state = {n: p.detach() for n, p in c.model.named_parameters() if p.requires_grad}
        await asyncio.to_thread(c.sampler.inner.load_weights, state, c.sampler.policy_version + 1)
        self._sync_s = time.perf_counter() - t0
        async with self._cond:
            self._cond.notify_all()

    def _step_extras(self) -> dict[str, float]:
        now = time.perf_counter()
        wall = max(now - self._t_mark, 1e-9)
        busy = {k: self.meters[k].read() - self._busy_mark.get(k, 0.0) for k in self.meters}
        self._t_mark, self._busy_mark = now, {k: m.read() for k, m in self.meters.items()}
        return {"async/step_wall_s": wall, "time/step": wall,
                "async/trainer_idle_frac": min(1.0, getattr(self, "_wait_s", 0.0) / wall),
                "async/sampler_idle_frac": max(0.0, 1.0 - busy["model_call"] / wall),
                "time/model_call_busy": busy["model_call"], "time/rollout_busy": busy["rollout"],
                "time/weight_sync": getattr(self, "_sync_s", 0.0)}
