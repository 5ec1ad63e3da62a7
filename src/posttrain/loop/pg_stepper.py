"""The policy-gradient stepper (GRPO and its family): one step, top to bottom.

    collected = collector.collect(step).numbered()       scored, shaped groups (sync or async); sample_ids
    seqs      = sequences_from_groups(collected.groups)  one Sequence per trajectory that did not fail
    seqs      = with_logprobs(seqs, ...)                 reference / teacher log-probs, when the run has them
    seqs, m   = shaped_sequences(seqs, options)          overlong filter, KL-as-reward (loop/shaping.py)
    batch, m  = build_batch(seqs, options)               advantages from the shaped rewards, trained part
    learner   = _outside_update(shown, batch)            pre-update log-probs of shown rows the update skips
    m, lps    = _optimize(batch, keep=shown)             behaviour log-probs; forward_backward + optim_step
    stats     = sample_stats(shown, batch, learner|lps)  what the report shows of each shown row
    StepResult(metrics, trajectories, stats)             what happened, handed back (loop/stepper.py)
    sync.push(version + 1); collector.on_weights(...)    the sampler serves the new weights

All math is in algos/ (looked up by name; the loss the trainer runs is composed there, algos/loss_terms.py); batch
assembly is a pure function (loop/batch.py). Per-sequence data moves as new Sequences, never by identity. The
stepper reads no config: what the run decided is its StepPlan (loop/step_plan.py), the rest are built parts.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Any

from posttrain.algos.dapo import has_signal
from posttrain.envs.task import Task
from posttrain.guidance.teacher import Teacher
from posttrain.loop.batch import (
    build_batch,
    sample_stats,
    sequences_from_groups,
    with_logprobs,
)
from posttrain.loop.collect import Collected, Collector
from posttrain.loop.shaping import shaped_sequences
from posttrain.loop.step_plan import StepPlan
from posttrain.loop.stepper import StepResult
from posttrain.loop.weight_sync import WeightSync
from posttrain.obs.metered import drain
from posttrain.obs.remedies import Overrides
from posttrain.obs.rollout_stats import pass_rates, rollout_metrics
from posttrain.obs.timers import StageTimer
from posttrain.rewards.telemetry import drain_task_metrics
from posttrain.training.protocol import PolicyTrainer, StepSettings
from posttrain.types import Batch, Trajectory, sequence_of


class PolicyGradientStepper:
    def __init__(
        self,
        plan: StepPlan,
        trainer: PolicyTrainer,
        collector: Collector,
        sync: WeightSync,
        pass_thresholds: dict[str, float],
        ref_model: Any | None = None,
        ref_disable_adapter: Callable[[], AbstractContextManager[Any]] | None = None,
        version: int = 0,
        teacher: Teacher | None = None,
        task: Task | None = None,
        plugins: dict[str, Any] | None = None,
    ):
        """`plan`: what the run decided (loop/step_plan.py). `pass_thresholds`: the task's rubric components (for
        pass rates). `ref_model`: a frozen reference for a KL term; with LoRA pass `ref_disable_adapter` instead (a
        context manager factory, e.g. peft's `model.disable_adapter`: the base model is the reference). `teacher`:
        a distillation teacher (guidance/teacher.py), scoring each step's sequences once (all num_iterations reuse
        it)."""
        self.plan, self.trainer, self.collector, self.sync = plan, trainer, collector, sync
        self.pass_thresholds = pass_thresholds
        self.ref_model, self.ref_disable_adapter = ref_model, ref_disable_adapter
        self.teacher = teacher
        # Run state beside the trainer (insight memory, RISED profiles): metrics(trajs) each step, saved with it.
        self.plugins: dict[str, Any] = dict(plugins or {})
        self.version = version
        self.task = task  # its reward objects' own metrics (judge cache hits, latency, ...) join each step's
        self.settings = StepSettings()  # a remedy's temperature, lr scale and entropy bonus (apply_overrides)

    async def step(self, step: int) -> StepResult:
        plan = self.plan
        timer, t0 = StageTimer(), time.perf_counter()
        m_hint: dict[str, float] = {}
        collected = (await self.collector.collect(step, timer)).numbered()
        seqs = sequences_from_groups(collected.groups, plan.hint_fn)
        if plan.kl_to_reference and seqs:
            seqs = with_logprobs(seqs, "ref_logprobs", self._ref_logprobs(Batch(seqs)))
        if self.teacher is not None and seqs:
            with timer("teacher"):
                seqs = with_logprobs(seqs, "teacher_logprobs", self.teacher.logprobs(seqs, self.settings.temperature))
            if plan.hint_fn is not None:
                m_hint = {
                    "hint/share": sum(s.hint is not None for s in seqs) / len(seqs),
                    "hint/unaligned": float(self.teacher.unaligned),
                }
        seqs, m_shape = shaped_sequences(seqs, plan.batch_options)
        batch, m = build_batch(seqs, plan.batch_options, policy_version=self.version)
        m = {**m_shape, **m}
        m.update(collected.metrics)
        m.update(m_hint)
        shown = self._shown(collected)  # the rows samples.jsonl keeps: the report colours their tokens
        learner: dict[int, list[float]] = {}
        if plan.samples_per_step:
            with timer("token_stats", step=step + 1):
                learner = await self._call(self._outside_update, shown, batch)
        with timer("train", step=step + 1):
            m_train, kept = await self._call(self._optimize, batch, {t.sample_id for t in shown})
            m.update(m_train)
        stats = sample_stats(shown, batch, {**learner, **kept})
        with timer("sync", step=step + 1):
            self.version += 1
            m.update(await self._call(self.sync.push, self.version))
            await self.collector.on_weights(self.version)
        trajs = [t for g in collected.all_groups for t in g.trajectories_G]
        m.update(rollout_metrics(trajs))
        m.update(pass_rates(trajs, self.pass_thresholds))
        if self.task is not None and not self.task.train_pass:  # label-free training: a 0% "pass" would read as a stall
            m = {k: v for k, v in m.items() if not (k.startswith(("pass_rate", "pass/")))}
        m.update(drain_task_metrics(self.task))
        m.update(drain(self.collector.sampler))  # the rollout sampler's own counters (its prefix cache, vLLM's)
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
        return StepResult(m, trajs, stats)

    async def _call(self, fn, *args):
        """Model work off the event loop in async mode, so rollout workers keep generating meanwhile."""
        return await asyncio.to_thread(fn, *args) if self.plan.off_event_loop else fn(*args)

    def _shown(self, collected: Collected) -> list[Trajectory]:
        """The first loop.samples_per_step trajectories of the step that did not fail (samples.jsonl keeps them)."""
        k = self.plan.samples_per_step
        return [t for t in [t for g in collected.all_groups for t in g.trajectories_G][:k] if not t.failed]

    def _outside_update(self, shown: list[Trajectory], batch: Batch) -> dict[int, list[float]]:
        """The learner's log-probs, before this step's update, of the shown rows the update does not train on
        (zero advantage, filtered groups), by sample_id: one forward pass over them. The rows it trains on get
        theirs from the update's own first forward pass instead (forward_backward's `keep`), which saves a pass
        that cost 5% of a json-extract step. Rows are matched by `sample_id`, never by position or identity."""
        trained = {s.sample_id for s in batch.sequences}
        rest = [t for t in shown if t.sample_id not in trained and t.sample_id is not None]
        if not rest:
            return {}
        lps = self.trainer.compute_logprobs(
            Batch([sequence_of(t) for t in rest]), temperature=self.settings.temperature
        )
        return {t.sample_id: lp for t, lp in zip(rest, lps, strict=True) if t.sample_id is not None}

    def _optimize(self, batch: Batch, keep: set[int | None]) -> tuple[dict[str, float], dict[int, list[float]]]:
        """num_iterations optimizer passes over the batch; the ratio's old policy per algorithm.behavior_logprobs.
        Returns the metrics and the first pass's log-probs of the sequences in `keep` (by sample_id)."""
        m: dict[str, float] = {}
        kept: dict[int, list[float]] = {}
        st = self.settings
        n_iter, loss = self.plan.num_iterations, self.plan.loss
        if self.plan.behaviour_from_sampler:
            batch = replace(
                batch, sequences=[replace(s, old_logprobs=list(s.sampler_logprobs)) for s in batch.sequences]
            )
        elif n_iter > 1:  # "trainer": the policy before this step's updates (with one pass: the current, detached)
            old = self.trainer.compute_logprobs(batch, temperature=st.temperature)
            batch = replace(batch, sequences=with_logprobs(batch.sequences, "old_logprobs", old))
        for i in range(n_iter):
            u = self.trainer.forward_backward(
                batch,
                loss.loss_fn,
                loss.params,
                loss.token_weight_fn,
                settings=st,
                keep={k for k in keep if k is not None} if i == 0 else (),  # before any update of this step
            )
            m.update(u.metrics)
            kept.update(u.logprobs)
            m.update(self.trainer.optim_step(st.lr_scale))
        return m, kept

    def _ref_logprobs(self, batch: Batch) -> list[list[float]]:
        temperature = self.settings.temperature
        if self.ref_model is not None:
            return self.trainer.compute_logprobs(batch, model=self.ref_model, temperature=temperature)
        if self.ref_disable_adapter is None:
            raise ValueError("a KL term needs a reference: ref_model, or ref_disable_adapter under LoRA")
        with self.ref_disable_adapter():  # LoRA: the reference is the base model
            return self.trainer.compute_logprobs(batch, temperature=temperature)

    def apply_overrides(self, ov: Overrides) -> None:
        """A remedy's overrides (obs/remedies.py) for the next steps: sampling through the collector; the trainer
        scores at the same temperature as the sampler; the learning rate scaled and the entropy bonus on while they
        last."""
        self.collector.adjust(ov)
        if ov.changes and "prompt_selection" in self.plugins:  # a new remedy: what nothing passed may pass now
            self.plugins["prompt_selection"].on_remedy()
        self.settings = StepSettings(
            temperature=ov.temperature or self.plan.base_temperature,
            lr_scale=ov.lr_scale,
            entropy_coef=ov.entropy_coef,
        )

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
