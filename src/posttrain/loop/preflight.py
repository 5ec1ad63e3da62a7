"""Preflight of a model x task (`posttrain env check --preflight`, and the run's start): build the run, measure
the greedy baseline, sample one step's groups, time one probe training step, and draw verdicts from it all
(obs/preflight_verdicts.py). It builds and trains, so it lives above the trainer, in the loop's layer.

    preflight(cfg) -> PreflightReport                              model x task: baseline, variance, memory
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only (components imports the model stack)
    from posttrain.config.schema import Config
    from posttrain.loop.components import Components


@dataclass
class PreflightReport:
    model: str
    task: str
    baseline_pass_rate: float
    baseline_reward: float
    zero_variance_frac: float  # groups whose G rewards are all equal: they carry no GRPO signal
    chat_template_ok: bool
    chat_template_detail: str
    memory_gb: dict[str, float]
    params: int
    measurements: Any = None  # envs.preflight.PreflightMeasurements: everything the verdicts were drawn from
    verdicts: list[Any] = field(default_factory=list)  # envs.preflight.Verdict, worst first

    def rows(self) -> list[tuple[str, str]]:
        mem = ", ".join(f"{k} {v:.3g}" for k, v in self.memory_gb.items())
        out = [
            ("model", self.model),
            ("task", self.task),
            ("parameters", f"{self.params:,}"),
            ("baseline pass rate", f"{self.baseline_pass_rate:.3f}"),
            ("baseline reward", f"{self.baseline_reward:.3f}"),
            ("zero-variance groups", f"{self.zero_variance_frac:.2f}"),
        ]
        m = self.measurements
        if m is not None:
            if m.sampled_pass_rate is not None:
                out.append(("sampled pass rate", f"{m.sampled_pass_rate:.3f} ({m.samples} samples)"))
            if m.truncated_frac is not None:
                out.append(("truncated samples", f"{m.truncated_frac:.2f} (max_tokens={m.max_tokens})"))
            out.append(("reward errors", str(m.reward_errors)))
            if m.step_seconds is not None:
                out.append(("probe step (s)", f"{m.step_seconds:.1f}"))
        out += [
            ("chat template prefix", ("ok: " if self.chat_template_ok else "BROKEN: ") + self.chat_template_detail),
            ("peak memory estimate (GB)", mem),
        ]
        return out


def chat_template_prefix_ok(tok: Any) -> tuple[bool, str]:
    """Multi-turn training needs rendering to be append-only, token for token (models/template_check.py)."""
    from posttrain.models.template_check import ChatTemplateError, check_prefix_property

    try:
        check_prefix_property(tok)
    except ChatTemplateError as e:
        return False, str(e)
    return True, "every turn of a 6-message tool conversation extends the previous rendering token for token"


def memory_estimate_gb(
    model: Any, trainable: int, total: int, batch_seqs: int, seq_len: int, ref_model: bool = False
) -> dict[str, float]:
    """A rough upper bound, in GB: weights, grads and AdamW's two moments (all in the weights' dtype, as
    torch keeps them), a reference copy when the KL term needs one, and the sampler's KV cache."""
    p = next(model.parameters())
    b = p.element_size()
    c = model.config
    layers = getattr(c, "num_hidden_layers", 0)
    heads = getattr(c, "num_attention_heads", 1)
    kv_heads = getattr(c, "num_key_value_heads", None) or heads
    head_dim = getattr(c, "head_dim", None) or getattr(c, "hidden_size", 0) // max(1, heads)
    gb = 1024**3
    out = {
        "weights": total * b / gb,
        "grads": trainable * b / gb,
        "adam": 2 * trainable * b / gb,
        "kv_cache": 2 * layers * kv_heads * head_dim * seq_len * batch_seqs * b / gb,
    }
    if ref_model:
        out["reference"] = total * b / gb
    out["total"] = sum(out.values())
    return out


def zero_variance_fraction(rewards_by_group: list[list[float]]) -> float:
    groups = [g for g in rewards_by_group if g]
    if not groups:
        return 0.0
    return sum(max(g) - min(g) < 1e-9 for g in groups) / len(groups)


def preflight(
    cfg: Config, n_prompts: int = 16, n_groups: int | None = None, log: Any = print, probe_step: bool = True
) -> PreflightReport:
    """Model x task preflight from a Config: greedy pass rate on `n_prompts` training prompts; `n_groups` groups
    of G (num_generations) sampled at the training temperature (default: one step's worth, prompts_per_step),
    for the zero-variance share, sampled pass rate, truncation and reward errors; one timed probe step (those
    groups sampled, then one forward/backward and optimizer step) for a run-time estimate; the chat-template
    check; a peak memory estimate; and the verdicts (obs/preflight_verdicts.py) drawn from all of it."""
    import asyncio

    from posttrain.envs.isolate import safe_rollout, score_isolated
    from posttrain.loop.components import build
    from posttrain.loop.evaluate import evaluate
    from posttrain.obs.preflight_verdicts import diagnose

    c = build(cfg, log=log)
    rows = c.task.train_rows[:n_prompts]
    m, greedy = evaluate(c.env, c.sampler, rows, c.eval_params)
    g = cfg.algorithm.num_generations
    n_groups = n_groups or int(cfg.loop.prompts_per_step)

    async def groups() -> list[list[Any]]:
        # All groups at once, as a training step samples them (the sampler batches concurrent requests), so the
        # timing is a step's, not n_groups sequential ones.
        rows_ = c.task.train_rows[:n_groups]
        # Isolated as in training (envs/isolate.py): a raising sample is a reward error the verdicts report.
        rolled = list(
            await asyncio.gather(*(safe_rollout(c.env, r, c.sampler, c.train_params) for r in rows_ for _ in range(g)))
        )
        trajs = await score_isolated(c.env, rolled)
        return [trajs[i * g : (i + 1) * g] for i in range(len(rows_))]

    t0 = time.perf_counter()
    sampled = asyncio.run(groups())
    sample_s = time.perf_counter() - t0
    step_s = None
    if probe_step:
        step_s = sample_s * cfg.loop.prompts_per_step / max(1, n_groups) + _probe_train_seconds(cfg, c, sampled, log)
    ok, detail = chat_template_prefix_ok(c.tokenizer)
    # the longest first prompt the env rendered (any env: a tool env has no prompt_ids of its own)
    prompt_len = max((len(t.turns[0].prompt_ids) for t in greedy if t.turns), default=0)
    mem = memory_estimate_gb(
        c.model,
        c.trainable_params,
        c.total_params,
        batch_seqs=cfg.loop.prompts_per_step * g,
        seq_len=prompt_len + c.train_params.max_tokens,
        ref_model=c.ref_model is not None,
    )
    # The run evaluates min(eval_prompts, held-out) prompts; the baseline here timed len(rows) of them.
    eval_s = m.get("eval/seconds", 0.0) * min(cfg.loop.eval_prompts, len(c.task.eval_rows)) / max(1, len(rows))
    meas = measurements_from(m, sampled, c, cfg, ok, detail, step_s, eval_s)
    return PreflightReport(
        cfg.model.name,
        c.task.name,
        m["eval/pass_rate"],
        m["eval/reward/mean"],
        meas.zero_variance_frac,
        ok,
        detail,
        mem,
        c.total_params,
        meas,
        diagnose(meas),
    )


def measurements_from(
    baseline: dict[str, float],
    sampled: list[list[Any]],
    c: Components,
    cfg: Config,
    template_ok: bool,
    template_detail: str,
    step_s: float | None,
    eval_s: float | None = None,
) -> Any:
    """PreflightMeasurements from a greedy baseline's metrics and sampled, scored groups of trajectories."""
    from posttrain.obs.preflight_verdicts import PreflightMeasurements

    trajs = [t for grp in sampled for t in grp]
    ok_trajs = [t for t in trajs if not t.failed]
    errors = [t for t in trajs if t.failed]
    rewards = [t.reward for t in ok_trajs]
    conversational = c.task.conversational
    no_template = conversational and not getattr(c.tokenizer, "chat_template", None)
    return PreflightMeasurements(
        baseline_pass_rate=baseline["eval/pass_rate"],
        zero_variance_frac=zero_variance_fraction([[t.reward for t in grp if not t.failed] for grp in sampled]),
        sampled_pass_rate=sum(t.passed for t in ok_trajs) / len(ok_trajs) if ok_trajs else 0.0,
        sampled_reward_mean=sum(rewards) / len(rewards) if rewards else None,
        sampled_reward_max=max(rewards) if rewards else None,
        truncated_frac=sum(t.turns[-1].finish_reason == "length" for t in trajs) / len(trajs) if trajs else None,
        max_tokens=c.train_params.max_tokens,
        reward_errors=len(errors),
        samples=len(trajs),
        first_error=(errors[0].error or "")[:160] if errors else None,
        multi_turn=bool(c.task.tools) or c.task.env_factory is not None,
        chat_template_ok=template_ok,
        chat_template_detail=template_detail,
        chat_prompts_without_template=bool(no_template),
        step_seconds=step_s,
        steps=cfg.loop.steps,
        eval_seconds=eval_s,
        num_generations=cfg.algorithm.num_generations,
    )


def _probe_train_seconds(cfg: Config, c: Components, sampled: list[list[Any]], log: Any) -> float:
    """Seconds of one forward/backward + optimizer step on the sampled groups. Advantages are set to +-1 so
    every sequence is trained on, as in a step with signal (a step on a no-signal batch is cheaper). The model
    is changed by it; a preflight throws its model away after."""
    from posttrain.loop.batch import BatchOptions, build_batch, sequences_from_groups
    from posttrain.loop.step_plan import StepPlan
    from posttrain.training.from_config import make_trainer, trainer_setup
    from posttrain.types import Group

    seqs = sequences_from_groups([Group(task_index=i, trajectories_G=list(grp)) for i, grp in enumerate(sampled)])
    seqs = [replace(s, reward=(-1.0) ** k) for k, s in enumerate(seqs)]  # +-1: every sequence trained on
    batch, _ = build_batch(seqs, BatchOptions(advantage="reward", scale_std=False))
    if not batch.sequences:
        return 0.0
    t0 = time.perf_counter()
    try:
        trainer = make_trainer(trainer_setup(cfg), c.model, c.tokenizer.pad_token_id)  # the run's own settings
        loss = StepPlan.from_config(cfg, c.train_params.max_tokens).loss  # the run's own loss
        trainer.forward_backward(batch, loss.loss_fn, loss.params, loss.token_weight_fn)
        trainer.optim_step()
    except Exception as e:  # noqa: BLE001 - the estimate is advice; a failure here must not hide the rest
        log(f"preflight: probe training step failed ({type(e).__name__}: {e}); the time estimate is sampling only")
        return 0.0
    return (time.perf_counter() - t0) * cfg.loop.prompts_per_step / max(1, len(sampled))
