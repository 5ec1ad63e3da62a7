"""The synchronous RL loop.

    for each step:  sample G completions per prompt -> rewards -> advantages -> num_iterations updates
                    -> weight sync to the sampler -> log, eval every N, checkpoint every N

With `warm_start.steps`, a supervised warm start on the task's demonstrations (loop/warm_start.py) runs first.
Held-out eval runs before training, every `loop.eval_every` steps and at the end. All math lives in algos/;
this file only orchestrates and times.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import torch

from posttrain.algos import ADVANTAGES, LOSSES, LossConfig
from posttrain.algos.dapo import has_signal
from posttrain.algos.token_weights import TOKEN_WEIGHTS
from posttrain.config.load import to_yaml
from posttrain.config.schema import Config
from posttrain.loop.builder import Components, build
from posttrain.loop.credit import apply_overlong_penalty, filter_overlong, kl_penalties, token_weight_fn
from posttrain.loop.dynamic_sampling import collect_groups, refill_rows
from posttrain.loop.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from posttrain.loop.evaluate import evaluate_async
from posttrain.loop.warm_start import WarmStartResult, run_warm_start
from posttrain.obs import console as con
from posttrain.obs.metrics import MetricsLogger
from posttrain.obs.rollout_stats import pass_rates, rollout_metrics, sample_records
from posttrain.obs.run_dir import make_run_dir, write_run_info
from posttrain.obs.timers import StageTimer
from posttrain.types import Batch, Group, groups_to_batch


@dataclass
class RunResult:
    run_dir: Path
    before: dict[str, float]
    after: dict[str, float]
    steps: int
    seconds: float


def prompts_for_step(n_rows: int, step: int, per_step: int, seed: int) -> list[int]:
    """Row indices for a step: epochs over a seeded shuffle. A pure function of the step, so resume needs no
    data-loader state beyond the step number."""
    out = []
    for k in range(step * per_step, (step + 1) * per_step):
        epoch, pos = divmod(k, n_rows)
        order = list(range(n_rows))
        random.Random(seed * 1_000_003 + epoch).shuffle(order)
        out.append(order[pos])
    return out


class RLLoop:
    def __init__(self, cfg: Config, run_dir: Path | None = None, resume: bool = False):
        self.cfg = cfg
        self.t_start = time.perf_counter()
        a = cfg.algorithm
        # Look the algorithm up first: a typo in its name should fail before a run dir or minutes of model loading.
        self.loss_fn = LOSSES[a.loss]
        self.adv_fn = ADVANTAGES[a.advantage]
        if a.token_weighting != "none":
            TOKEN_WEIGHTS[a.token_weighting]
        if run_dir is None:
            run_dir = make_run_dir(cfg.run.output_dir, cfg.run.name, cfg.task.name)
        self.run_dir = Path(run_dir)
        self.say = partial(con.print_line, enabled=cfg.logging.console)
        if not resume:
            write_run_info(self.run_dir, to_yaml(cfg), cfg.run.seed)
        self.c: Components = build(cfg, log=self.say)
        if cfg.task.env_check != "off":
            self._env_check()
        self.logger = MetricsLogger(str(self.run_dir), tensorboard=cfg.logging.tensorboard)
        # With KL as a reward penalty the loss has no KL term (beta=0 there); the reference is still loaded.
        self.loss_cfg = LossConfig(epsilon=a.epsilon, epsilon_high=a.epsilon_high,
                                   beta=a.beta if a.kl_mode == "loss" else 0.0, kl_estimator=a.kl_estimator,
                                   aggregation=a.aggregation, max_tokens=self.c.train_params.max_tokens,
                                   cispo_epsilon_low=a.cispo_epsilon_low, dual_clip=a.dual_clip)
        self.token_weight_fn = token_weight_fn(a)
        self._overlong_pen: list[float] = []
        self.eval_rows = self.c.task.eval_rows[: cfg.loop.eval_prompts]
        self.start_step = 0
        self.before: dict[str, float] = {}
        if resume:
            self._resume()

    # ---- lifecycle ---------------------------------------------------------------------------------------
    def _env_check(self) -> None:
        """The task's smoke checks (known-good and known-bad answers, smoke commands) before any training."""
        from posttrain.envs.check import EnvCheckError, check_task, results_table

        results = check_task(self.c.task)
        if all(r.ok for r in results):
            self.say(f"env check: {len(results)} check(s) ok")
            return
        if self.cfg.logging.console:
            con.console.print(results_table(results, title=f"env check: {self.c.task.name}"))
        failed = "; ".join(f"{r.check}: expected {r.expected}, got {r.got}" for r in results if not r.ok)
        if self.cfg.task.env_check == "refuse":
            raise EnvCheckError(f"env check failed for task {self.c.task.name!r}: {failed} "
                                "(task.env_check=warn trains anyway)", results)
        self.say(f"warning: env check failed, training anyway (task.env_check=warn): {failed}")

    def _resume(self) -> None:
        ckpt = latest_checkpoint(self.run_dir)
        if ckpt is None:
            raise FileNotFoundError(f"no checkpoint to resume from in {self.run_dir}/checkpoints")
        state = load_checkpoint(ckpt, self.c.trainer, self.c.sampler.generator)
        self.start_step = state["step"]
        self.before = state.get("before", {})
        self.c.sampler.policy_version = state.get("policy_version", self.start_step)
        _truncate_jsonl(self.run_dir / "metrics.jsonl", self.start_step)
        _truncate_jsonl(self.run_dir / "samples.jsonl", self.start_step)
        self.say(f"resumed from {ckpt} at step {self.start_step}")

    def run(self) -> RunResult:
        return asyncio.run(self.run_async())

    async def run_async(self) -> RunResult:
        cfg, c = self.cfg, self.c
        self.say(f"run dir: {self.run_dir}")
        self.say(f"model: {cfg.model.name} ({c.trainable_params / 1e6:.1f}M trainable of {c.total_params / 1e6:.1f}M)"
                 f" | task: {c.task.name} ({len(c.task.train_rows)} train / {len(self.eval_rows)} held-out prompts)"
                 f" | {cfg.loop.steps} steps x {cfg.loop.prompts_per_step} prompts x G={cfg.algorithm.num_generations}")
        self.warm: WarmStartResult | None = None
        if cfg.warm_start.steps and self.start_step == 0:
            await self._warm_start()
        if (self.start_step == 0 or not self.before) and cfg.loop.eval_before:
            self.before = await self._eval(0, "before training" if self.warm is None else "after the warm start")
        last_eval = self.before
        step = self.start_step
        t_train = time.perf_counter()
        try:
            for step in range(self.start_step, cfg.loop.steps):
                await self._train_step(step)
                done = step + 1
                if cfg.loop.eval_every and done % cfg.loop.eval_every == 0 and done < cfg.loop.steps:
                    last_eval = await self._eval(done, "held-out")
                if cfg.loop.save_every and done % cfg.loop.save_every == 0:
                    self._checkpoint(done)
                if cfg.loop.time_budget_s and time.perf_counter() - t_train >= cfg.loop.time_budget_s:
                    self.say(f"time budget of {cfg.loop.time_budget_s:.0f}s reached after step {done}")
                    break
            else:
                done = cfg.loop.steps
            await self._training_done()
            step = done if cfg.loop.steps > self.start_step else self.start_step
            if step > self.start_step:
                # Checkpoint before the final eval, so that resuming to train further continues exactly as an
                # uninterrupted run would (eval may consume sampler randomness).
                if not (cfg.loop.save_every and step % cfg.loop.save_every == 0):
                    self._checkpoint(step)
                last_eval = await self._eval(step, "after training")
                self._save_final()
            elif self.warm is not None:  # warm start only (loop.steps=0): its model is the result
                self._save_final()
        finally:
            self.logger.close()
        elapsed = time.perf_counter() - self.t_start
        if self.warm is not None and self.base_eval:
            cols = [("base", _with_reward(self.base_eval)), ("warm start", self.before)]
            cols += [("after RL", last_eval)] if step > self.start_step else []
        else:
            cols = [("before", self.before), ("after", last_eval)]
        title = f"held-out ({len(self.eval_rows)} prompts): {' vs '.join(c for c, _ in cols)}"
        con.console.print(con.eval_table(title, cols)) if cfg.logging.console else None
        self.say(f"done in {elapsed / 60:.1f} min -> {self.run_dir}")
        summary = {"before": self.before, "after": last_eval, "steps": step, "wall_seconds": elapsed}
        if self.warm is not None:
            summary["warm_start"] = {**asdict(self.warm), "base_eval": self.base_eval}
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        return RunResult(self.run_dir, self.before, last_eval, step, elapsed)

    # ---- one step ----------------------------------------------------------------------------------------
    async def _sample_groups(self, row_indices: list[int], timer: StageTimer) -> list[Group]:
        """Roll out G completions for each row and score them (reward shaping included)."""
        c, G = self.c, self.cfg.algorithm.num_generations
        rows = [c.task.train_rows[i] for i in row_indices]
        with timer("sample"):
            trajs = list(await asyncio.gather(*(c.env.rollout(r, c.sampler) for r in rows for _ in range(G))))
        with timer("reward"):
            await c.env.score(trajs)
        groups = [Group(task_index=idx, trajectories_G=trajs[i * G : (i + 1) * G]) for i, idx in enumerate(row_indices)]
        self._overlong_pen.append(apply_overlong_penalty(groups, self.cfg.algorithm, c.train_params.max_tokens))
        return groups

    async def _collect(self, step: int, timer: StageTimer) -> tuple[list[Group], list[Group], dict[str, float]]:
        cfg, a = self.cfg, self.cfg.algorithm
        n_rows = len(self.c.task.train_rows)
        first = prompts_for_step(n_rows, step, cfg.loop.prompts_per_step, cfg.run.seed)
        self._overlong_pen = []
        if not a.dynamic_sampling:
            groups = await self._sample_groups(first, timer)
            return groups, groups, {}
        kept, all_groups, stats = await collect_groups(
            lambda rows: self._sample_groups(rows, timer), first,
            lambda rnd, k, used: refill_rows(n_rows, step, rnd, k, cfg.run.seed, used),
            target=cfg.loop.prompts_per_step, max_rounds=a.max_refill_rounds,
            keep=lambda g: has_signal(g.rewards_G))
        return kept, all_groups, stats.metrics()

    async def _train_step(self, step: int) -> dict[str, Any]:
        cfg, c, a = self.cfg, self.c, self.cfg.algorithm
        timer = StageTimer()
        groups, all_groups, m = await self._collect(step, timer)
        trajs = [t for g in all_groups for t in g.trajectories_G]
        for g in groups:  # provisional zero advantages: the KL-as-reward penalty needs the batch first
            g.advantages_G = [0.0] * len(g.trajectories_G)
        full_batch = groups_to_batch(groups, policy_version=c.sampler.policy_version)
        if a.overlong_filter:
            m["dapo/overlong_filtered"] = float(filter_overlong(groups, full_batch))
        ref_lp = self._ref_logprobs(full_batch) if a.beta > 0 and full_batch.sequences else None
        rewards = [t.reward for g in groups for t in g.trajectories_G if not t.failed]
        gids = [gi for gi, g in enumerate(groups) for t in g.trajectories_G if not t.failed]
        if a.beta > 0 and a.kl_mode == "reward" and ref_lp is not None:
            pen = kl_penalties(full_batch, ref_lp, a.beta, a.kl_estimator)
            rewards = [r - p for r, p in zip(rewards, pen)]
            m["kl/reward_penalty_mean"] = sum(pen) / max(len(pen), 1)
        rewards_N = torch.tensor(rewards, dtype=torch.float32)
        adv_N = (self.adv_fn(rewards_N, torch.tensor(gids), scale_std=a.scale_std) if rewards
                 else torch.zeros(0))
        for s, adv in zip(full_batch.sequences, adv_N.tolist()):
            s.advantage = adv
        batch, loss_cfg = self._trainable_part(full_batch)
        ref_for_loss = None
        if ref_lp is not None and a.kl_mode == "loss":
            keep = {id(s) for s in batch.sequences}
            ref_for_loss = [r for s, r in zip(full_batch.sequences, ref_lp) if id(s) in keep]
        with timer("train"):
            m.update(await self._optimize(batch, loss_cfg, ref_for_loss))
        with timer("sync"):
            await self._sync_weights()
        m.update(rollout_metrics(trajs))
        m.update(pass_rates(trajs, {x.name: x.pass_threshold for x in c.task.rubric.components}))
        zero_var = sum(1 for g in all_groups if not has_signal(g.rewards_G))
        n_tok = sum(t.num_completion_tokens for t in trajs)
        if a.overlong_buffer_frac > 0:
            m["dapo/overlong_penalty_mean"] = sum(self._overlong_pen) / max(len(self._overlong_pen), 1)
        m.update({
            "adv/mean": float(adv_N.mean()) if len(adv_N) else 0.0,
            "adv/std": float(adv_N.std()) if len(adv_N) > 1 else 0.0,
            "adv/abs_max": float(adv_N.abs().max()) if len(adv_N) else 0.0,
            "groups/zero_variance_frac": zero_var / max(len(all_groups), 1),
            "groups/trained": float(len(groups)),
            "tokens/completion": float(n_tok), "tokens/trained": float(batch.num_tokens),
            "train/zero_adv_seqs_skipped": float(len(full_batch.sequences) - len(batch.sequences)),
            "perf/sample_tokens_per_s": n_tok / max(timer.seconds.get("sample", 0.0), 1e-9),
            "policy_version": float(c.sampler.policy_version),
        })
        m.update(timer.metrics())
        m["time/step"] = sum(timer.seconds.values())
        m.update(self._step_extras())
        self.logger.log({"kind": "train", "step": step + 1, **m})
        if cfg.loop.samples_per_step:
            self.logger.log_samples(step + 1, sample_records(trajs, cfg.loop.samples_per_step))
        for t in trajs:
            if t.failed and t.error:
                self.say(f"  sample failed (kept out of training): {t.error}")
                break
        self.say(con.step_line(step + 1, cfg.loop.steps, m))
        return m

    async def _optimize(self, batch: Batch, loss_cfg: LossConfig, ref_lp: list[list[float]] | None) -> dict[str, Any]:
        """num_iterations optimizer passes over the batch (PPO-style reuse scores against the pre-update policy)."""
        c, m = self.c, {}
        old_lp = c.trainer.compute_logprobs(batch) if self.cfg.loop.num_iterations > 1 else None
        for _ in range(self.cfg.loop.num_iterations):
            m.update(c.trainer.forward_backward(batch, self.loss_fn, loss_cfg, old_lp, ref_lp,
                                                token_weight_fn=self.token_weight_fn))
            m.update(c.trainer.optim_step())
        return m

    async def _sync_weights(self) -> None:
        # In-process share: the sampler holds the trainer's module, so syncing is a version bump.
        self.c.sampler.policy_version += 1

    def _step_extras(self) -> dict[str, float]:
        """Hook: extra per-step metrics (the async loop's idle fractions and busy times)."""
        return {}

    async def _training_done(self) -> None:
        """Hook: the last train step ran (the async loop stops its rollout workers here)."""

    def _trainable_part(self, batch: Batch) -> tuple[Batch, LossConfig]:
        """Leave zero-advantage sequences out of the forward/backward when that changes nothing.

        With no KL term, a sequence whose advantage is 0 contributes exactly 0 to the policy-gradient loss and
        its gradient (every registered loss is A times something). It still counts in the normalizers, so we
        pass the full batch's counts: the update is identical, and the compute for groups whose rewards were
        all equal (common early in a run) is saved.
        """
        cfg = replace(self.loss_cfg, total_tokens=float(max(batch.num_loss_tokens, 1)),
                      total_seqs=float(max(len(batch.sequences), 1)))
        if cfg.beta > 0:  # a KL term in the loss: every sequence contributes
            return batch, cfg
        keep = [s for s in batch.sequences if s.advantage != 0.0 and any(s.loss_mask)]
        return Batch(sequences=keep, policy_version=batch.policy_version), cfg

    def _ref_logprobs(self, batch):
        c = self.c
        if c.ref_model is not None:
            return c.trainer.compute_logprobs(batch, model=c.ref_model)
        with c.model.disable_adapter():  # LoRA: the reference is the base model
            return c.trainer.compute_logprobs(batch)

    async def _warm_start(self) -> None:
        """Supervised steps on the task's demonstrations (loop/warm_start.py), evaluated before when eval_before."""
        c = self.c
        self.base_eval: dict[str, float] = {}
        if self.cfg.loop.eval_before:
            m, _ = await evaluate_async(c.env, c.sampler, self.eval_rows, c.eval_params, self.cfg.loop.eval_samples)
            self.base_eval = m
            self.logger.log({"kind": "warm_start_eval", "step": 0,
                             **{k.replace("eval/", "warm_start/base_eval/"): v for k, v in m.items()}})
            self.say(f"eval (before the warm start): pass_rate={m['eval/pass_rate']:.3f} "
                     f"reward={m['eval/reward/mean']:.3f} [{m['eval/seconds']:.1f}s]")
        self.warm = await run_warm_start(self.cfg, c.model, c.tokenizer, c.env, c.task, c.train_params,
                                         c.trainer.pad_id, self.say, self.logger.log)
        await self._after_warm_start()

    async def _after_warm_start(self) -> None:
        """Hook: the policy's weights changed outside a train step (the async loop copies them to its sampler)."""

    async def _eval(self, step: int, label: str) -> dict[str, float]:
        m, trajs = await evaluate_async(self.c.env, self.c.sampler, self.eval_rows, self.c.eval_params,
                                         self.cfg.loop.eval_samples)
        self.logger.log({"kind": "eval", "step": step, **m})
        self.logger.log_samples(step, [{"eval": True, **r} for r in sample_records(trajs, 4)])
        self.say(f"eval ({label}, step {step}): pass_rate={m['eval/pass_rate']:.3f} reward={m['eval/reward/mean']:.3f} "
                 f"[{m['eval/seconds']:.1f}s]")
        m["eval/reward"] = m["eval/reward/mean"]
        return m

    def _checkpoint(self, step: int) -> None:
        save_checkpoint(self.run_dir, step, self.c.trainer, self.c.sampler.generator,
                        {"before": self.before, "policy_version": self.c.sampler.policy_version},
                        keep=self.cfg.loop.keep_checkpoints)

    def _save_final(self) -> None:
        out = self.run_dir / "final"
        try:
            self.c.model.save_pretrained(out)
            self.c.tokenizer.save_pretrained(out)
        except Exception as e:  # noqa: BLE001 - the checkpoint already holds the weights; report and go on
            self.say(f"warning: could not export the final model to {out}: {e}")


def _with_reward(m: dict[str, float]) -> dict[str, float]:
    return {**m, "eval/reward": m["eval/reward/mean"]} if "eval/reward/mean" in m else m


def _truncate_jsonl(path: Path, max_step: int) -> None:
    """On resume, drop records written after the checkpoint (they will be produced again)."""
    if not path.exists():
        return
    # Warm-start records come before step 1 and are not redone on resume: always kept.
    keep = [line for line in path.read_text().splitlines() if line.strip() and (
        json.loads(line).get("step", 0) <= max_step or json.loads(line).get("kind", "").startswith("warm_start"))]
    path.write_text("".join(line + "\n" for line in keep))


def train(cfg: Config, run_dir: Path | None = None, resume: bool = False) -> RunResult:
    """The high-level API: run a whole training job from a Config (`algorithm.name=es` runs evolution strategies)."""
    if cfg.algorithm.name == "es":
        from posttrain.loop.es_loop import ESLoop  # es_loop builds on this module

        return ESLoop(cfg, run_dir=run_dir, resume=resume).run()
    if cfg.loop.mode == "async":
        from posttrain.loop.async_loop import AsyncRLLoop

        return AsyncRLLoop(cfg, run_dir=run_dir, resume=resume).run()
    return RLLoop(cfg, run_dir=run_dir, resume=resume).run()
