"""The policy-gradient stepper (GRPO and its family): one step, top to bottom.

    collected = collector.collect(step)                  scored, shaped groups (sync or async)
    number_samples(collected.all_groups)                 each trajectory's sample_id
    seqs      = sequences_from_groups(collected.groups)  one Sequence per trajectory that did not fail
    seqs      = with_logprobs(seqs, ...)                 reference / teacher log-probs, when the run has them
    batch, m  = build_batch(seqs, options)               overlong filter, KL-as-reward, advantages, trained part
    batch     = _token_stats(shown, batch)               the rows the report shows, marked for capture
    m, batch  = _optimize(batch)                         behaviour log-probs; forward_backward + optim_step
    record_token_stats(shown, batch)                     advantage and pre-update log-probs onto the shown rows
    sync.push(version + 1); collector.on_weights(...)    the sampler serves the new weights

All math is in algos/ (looked up by name; the loss the trainer runs is composed there, algos/loss_terms.py); batch
assembly is a pure function (loop/batch.py). Per-sequence data moves as new Sequences, never by identity.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from functools import partial
from typing import Any

from posttrain.algos import LOSSES
from posttrain.algos.dapo import has_signal
from posttrain.algos.loss_terms import with_terms
from posttrain.config.schema import Config
from posttrain.loop.batch import (
    BatchOptions,
    build_batch,
    env_hint,
    feedback_hint,
    first_hint,
    number_samples,
    record_token_stats,
    remedy_hint,
    sequences_from_groups,
    with_logprobs,
)
from posttrain.loop.collect import Collector
from posttrain.loop.weight_sync import WeightSync
from posttrain.obs.rollout_stats import pass_rates, rollout_metrics
from posttrain.obs.timers import StageTimer
from posttrain.rewards.telemetry import drain_task_metrics
from posttrain.training.from_config import loss_params, run_remedies, self_teacher, token_weight_fn
from posttrain.training.trainer import Trainer
from posttrain.types import Batch, Trajectory, sequence_of


class PolicyGradientStepper:
    def __init__(
        self,
        cfg: Config,
        trainer: Trainer,
        collector: Collector,
        sync: WeightSync,
        pass_thresholds: dict[str, float],
        max_tokens: int,
        ref_model: Any | None = None,
        ref_disable_adapter: Any | None = None,
        version: int = 0,
        teacher: Any | None = None,
        task: Any | None = None,
        plugins: dict[str, Any] | None = None,
    ):
        """`pass_thresholds`: the task's rubric components (for pass rates); `max_tokens`: the completion budget.
        `ref_model`: a frozen reference for a KL term; with LoRA pass `ref_disable_adapter` instead (a context
        manager factory, e.g. peft's `model.disable_adapter`: the base model is the reference). `teacher`: a
        distillation teacher (guidance/teacher.py), scoring each step's sequences once (all num_iterations reuse it)."""
        self.cfg, self.trainer, self.collector, self.sync = cfg, trainer, collector, sync
        a = cfg.algorithm
        self.loss_fn = with_terms(LOSSES[a.loss])  # the policy loss, then distillation and entropy terms
        self.params = loss_params(cfg, max_tokens)
        self.pass_thresholds = pass_thresholds
        self.batch_options = BatchOptions.from_config(a)
        self.token_weight_fn = token_weight_fn(a)
        self.ref_model, self.ref_disable_adapter = ref_model, ref_disable_adapter
        self.teacher = teacher
        # What a self-hint teacher reads: a remedy's format hint or the sample's own feedback (hint_distill), else
        # the hint its env wrote (insights, RISED).
        own = self_teacher(a, run_remedies(cfg))
        feedback = partial(feedback_hint, template=a.hint_distill.template) if a.hint_distill.enabled else None
        self.hint_fn = (
            None
            if own is None
            else env_hint
            if own[0] != "hint"
            else first_hint(partial(remedy_hint, template=a.hint_distill.template), feedback)
        )
        # Run state beside the trainer (insight memory, RISED profiles): metrics(trajs) each step, saved with it.
        self.plugins: dict[str, Any] = dict(plugins or {})
        self.version = version
        self.task = task  # its reward objects' own metrics (judge cache hits, latency, ...) join each step's
        self.last_trajectories: list = []  # the last step's rollouts, for samples.jsonl

    async def step(self, step: int) -> dict[str, Any]:
        cfg, a = self.cfg, self.cfg.algorithm
        timer, t0 = StageTimer(), time.perf_counter()
        m_hint: dict[str, float] = {}
        collected = await self.collector.collect(step, timer)
        number_samples(collected.all_groups)
        seqs = sequences_from_groups(collected.groups, self.hint_fn)
        if a.beta > 0 and seqs:
            seqs = with_logprobs(seqs, "ref_logprobs", self._ref_logprobs(Batch(seqs)))
        if self.teacher is not None and seqs:
            with timer("teacher"):
                seqs = with_logprobs(seqs, "teacher_logprobs", self.teacher.logprobs(seqs))
            if self.hint_fn is not None:
                m_hint = {
                    "hint/share": sum(s.hint is not None for s in seqs) / len(seqs),
                    "hint/unaligned": float(getattr(self.teacher, "unaligned", 0)),
                }
        batch, m = build_batch(seqs, self.batch_options, policy_version=self.version)
        m.update(collected.metrics)
        m.update(m_hint)
        shown = self._shown(collected)  # the rows samples.jsonl keeps: the report colours their tokens
        if cfg.loop.samples_per_step:
            with timer("token_stats", step=step + 1):
                batch = await self._call(self._token_stats, shown, batch)
        with timer("train", step=step + 1):
            m_train, batch = await self._call(self._optimize, batch)
            m.update(m_train)
        record_token_stats(shown, batch)  # the update's own first forward pass measured these (before the update)
        with timer("sync", step=step + 1):
            self.version += 1
            m.update(await self._call(self.sync.push, self.version))
            await self.collector.on_weights(self.version)
        trajs = [t for g in collected.all_groups for t in g.trajectories_G]
        m.update(rollout_metrics(trajs))
        m.update(pass_rates(trajs, self.pass_thresholds))
        if not getattr(self.task, "train_pass", True):  # label-free training: a 0% "pass" would read as a stall
            m = {k: v for k, v in m.items() if not (k.startswith(("pass_rate", "pass/")))}
        m.update(drain_task_metrics(self.task))
        drain_sampler = getattr(self.collector.sampler, "drain_metrics", None)  # a sampler without counters: none
        if callable(drain_sampler):  # the rollout sampler's own counters (its prefix cache)
            m.update(drain_sampler())
        for plugin in self.plugins.values():
            m.update(plugin.metrics(trajs))
        n_tok = sum(t.num_completion_tokens for t in trajs)
        m.update(
            {
                "groups/zero_variance_frac": sum(not has_signal(g.rewards_G) for g in collected.all_groups)
                / max(len(collected.all_groups), 1),
                "groups/trained": float(len(collected.groups)),
                "tokens/completion": float(n_tok),
                "policy_version": float(self.version),
            }
        )
        if timer.seconds.get("sample", 0.0) > 0:  # the async loop samples in the background: no step-local rate
            m["perf/sample_tokens_per_s"] = n_tok / timer.seconds["sample"]
        m.update(timer.metrics())
        m["time/step"] = time.perf_counter() - t0
        m.update(self.collector.window_metrics(m["time/step"]))
        self.last_trajectories = trajs
        return m

    async def _call(self, fn, *args):
        """Model work off the event loop in async mode, so rollout workers keep generating meanwhile."""
        return await asyncio.to_thread(fn, *args) if self.cfg.loop.mode == "async" else fn(*args)

    def _shown(self, collected: Any) -> list[Trajectory]:
        """The first loop.samples_per_step trajectories of the step that did not fail (samples.jsonl keeps them)."""
        k = self.cfg.loop.samples_per_step
        return [t for t in [t for g in collected.all_groups for t in g.trajectories_G][:k] if not t.failed]

    def _token_stats(self, shown: list[Trajectory], batch: Batch) -> Batch:
        """Per-token data of the shown rows: the trainer's log-prob of every completion token before this step's
        update, beside the sampler's (obs/rollout_stats.sample_records writes them).

        A shown row the update trains on gets its log-probs from the update's own first forward pass: its
        sequence is marked `capture_logprobs` in the returned batch and the trainer fills `trainer_logprobs`
        (Trainer.captures_logprobs), so no extra pass runs for it: that pass cost 5% of a json-extract step. Only
        rows outside the update (zero advantage, filtered groups) or a trainer in other processes need one forward
        pass here, before the update. Rows are matched by `sample_id`, never by position or object identity."""
        ids = {t.sample_id for t in shown}
        if getattr(self.trainer, "captures_logprobs", False):
            batch = replace(
                batch,
                sequences=[replace(s, capture_logprobs=True) if s.sample_id in ids else s for s in batch.sequences],
            )
        captured = {s.sample_id for s in batch.sequences if s.capture_logprobs}
        rest = [t for t in shown if t.sample_id not in captured]
        if rest:
            lps = self.trainer.compute_logprobs(Batch([sequence_of(t) for t in rest]))
            for t, lp in zip(rest, lps, strict=True):  # compute_logprobs answers in its batch's order
                t.trainer_logprobs = [round(x, 4) for x in lp]
        return batch

    def _optimize(self, batch: Batch) -> tuple[dict[str, float], Batch]:
        """num_iterations optimizer passes over the batch; the ratio's old policy per algorithm.behavior_logprobs.
        Returns the metrics and the batch it trained (with the behaviour log-probs and any captured trainer
        log-probs on its sequences)."""
        m: dict[str, float] = {}
        n_iter = self.cfg.loop.num_iterations
        if self.cfg.algorithm.behavior_logprobs == "sampler":
            batch = replace(
                batch, sequences=[replace(s, old_logprobs=list(s.sampler_logprobs)) for s in batch.sequences]
            )
        elif n_iter > 1:  # "trainer": the policy before this step's updates (with one pass: the current, detached)
            batch = replace(
                batch, sequences=with_logprobs(batch.sequences, "old_logprobs", self.trainer.compute_logprobs(batch))
            )
        for _ in range(n_iter):
            m.update(self.trainer.forward_backward(batch, self.loss_fn, self.params, self.token_weight_fn))
            m.update(self.trainer.optim_step())
        return m, batch

    def _ref_logprobs(self, batch: Batch) -> list[list[float]]:
        if self.ref_model is not None:
            return self.trainer.compute_logprobs(batch, model=self.ref_model)
        with self.ref_disable_adapter():  # LoRA: the reference is the base model
            return self.trainer.compute_logprobs(batch)

    def apply_overrides(self, ov: Any) -> None:
        """A remedy's overrides (obs/remedies.py) for the next steps: sampling through the collector; the trainer
        scores at the same temperature as the sampler; the learning rate scaled and the entropy bonus on while they
        last."""
        self.collector.adjust(ov)
        if ov.changes and "prompt_selection" in self.plugins:  # a new remedy: what nothing passed may pass now
            self.plugins["prompt_selection"].on_remedy()
        self.trainer.temperature = ov.temperature or self.cfg.sampling.temperature or 1.0
        self.trainer.lr_scale = ov.lr_scale
        self.trainer.entropy_coef = ov.entropy_coef

    # ---- Stepper protocol --------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        state = {"trainer": self.trainer.state_dict(), "policy_version": self.version}
        state.update({name: p.state_dict() for name, p in self.plugins.items()})
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.trainer.load_state_dict(state["trainer"])
        self.version = state["policy_version"]
        for name, p in self.plugins.items():
            if name in state:
                p.load_state_dict(state[name])
        self.sync.push(self.version)

    async def close(self) -> None:
        await self.collector.close()
        self.sync.close()  # after the collector: no rollout is in flight on the samplers it releases
        self.trainer.close()
